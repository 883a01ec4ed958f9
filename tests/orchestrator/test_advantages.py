import pytest
import torch

from orchestrator.advantages import compute_advantages, informative_groups, overlong_penalty


def test_grpo_rloo_and_no_std_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    grpo = compute_advantages("grpo", rewards, groups)
    std = torch.tensor([1.0, 0, 0, 1]).std()
    assert grpo[:4].tolist() == pytest.approx([(0.5 / std).item(), (-0.5 / std).item(), (-0.5 / std).item(), (0.5 / std).item()], rel=1e-4)
    assert grpo[4:].tolist() == [0.0, 0.0, 0.0]  # equal rewards, and a group of one
    assert compute_advantages("grpo_no_std", rewards, groups)[:4].tolist() == [0.5, -0.5, -0.5, 0.5]
    # RLOO: 1 − mean(0, 0, 1) = 2/3
    assert compute_advantages("rloo", rewards, groups)[0].item() == pytest.approx(2 / 3)


def test_unknown_estimator_and_bad_shapes():
    with pytest.raises(ValueError, match="advantage estimator"):
        compute_advantages("ppo-gae", torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages("grpo", torch.zeros(2), torch.zeros(3))


def test_dynamic_sampling_drops_zero_variance_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([5, 5, 7, 7, 9, 9])
    assert informative_groups(rewards, groups).tolist() == [False, False, True, True, False, False]


def test_overlong_penalty_ramp():
    lengths = torch.tensor([10, 16, 18, 20, 25])
    penalty = overlong_penalty(lengths, max_length=20, buffer=4)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(lengths, max_length=20, buffer=0)
