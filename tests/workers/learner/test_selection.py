import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pydantic import ValidationError

from workers.learner.losses import PolicyLossConfig, effective_grad_coef
from workers.learner.selection import SelectionConfig, keep_count, select_tokens


def _batch(seed=0, groups=3, group_size=4, length=10):
    g = torch.Generator().manual_seed(seed)
    rows = groups * group_size
    mask = torch.ones(rows, length)
    lengths = torch.randint(2, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).float()
    entropy = torch.rand(rows, length, generator=g) * 3
    logp = -torch.rand(rows, length, generator=g) * 2
    old_logp = logp + 0.1 * torch.randn(rows, length, generator=g)
    adv = torch.randn(rows, generator=g)
    group_ids = torch.arange(groups).repeat_interleave(group_size)
    return dict(response_mask=mask, entropy=entropy, logp=logp, old_logp=old_logp, advantages=adv, group_ids=group_ids)


def _kept_per_group(selection, group_ids):
    return {int(g): int(selection.mask[group_ids == g].sum()) for g in group_ids.unique()}


@pytest.mark.parametrize("method", ["ets", "gmts", "random"])
@pytest.mark.parametrize("ratio", [0.1, 0.2, 0.5, 0.9, 1.0])
def test_group_scope_keeps_ceil_ratio_of_each_group(method, ratio):
    """Regression for the released code, whose loop only reached the first group."""
    b = _batch()
    sel = select_tokens(**b, config=SelectionConfig(method=method, ratio=ratio, scope="group"))
    for g in b["group_ids"].unique():
        rows = b["group_ids"] == g
        n_eligible = int(sel.eligible[rows].sum())
        assert int(sel.mask[rows].sum()) == math.ceil(round(ratio * n_eligible, 9)) > 0
    assert not (sel.mask & ~b["response_mask"].bool()).any()


@pytest.mark.parametrize("mode", ["top", "bottom"])
def test_micro_batch_scope_selects_the_extreme_scores(mode):
    b = _batch(seed=1)
    sel = select_tokens(**b, config=SelectionConfig(method="ets", ratio=0.2, scope="micro_batch", mode=mode))
    inside = b["response_mask"].bool()
    chosen, rest = b["entropy"][sel.mask], b["entropy"][inside & ~sel.mask]
    assert sel.mask.sum() == math.ceil(0.2 * inside.sum())
    if mode == "top":
        assert chosen.min() >= rest.max()
    else:
        assert chosen.max() <= rest.min()


def test_gmts_score_is_entropy_times_abs_omega_and_excludes_zero_scores():
    b = _batch(seed=2)
    b["advantages"][:4] = 0.0  # the first group has no signal
    loss = PolicyLossConfig(clip_high=0.28)
    sel = select_tokens(**b, config=SelectionConfig(method="gmts", ratio=0.5, scope="micro_batch"), loss_config=loss)
    omega = effective_grad_coef(b["logp"], b["old_logp"], b["advantages"][:, None].expand_as(b["logp"]),
                                b["response_mask"], loss)
    torch.testing.assert_close(sel.scores, b["entropy"] * omega.abs() * b["response_mask"])
    assert not sel.eligible[:4].any() and not sel.mask[:4].any()
    assert sel.mask.sum() == math.ceil(0.5 * sel.eligible.sum())


def test_gmts_differs_from_ets_when_advantages_differ():
    b = _batch(seed=3)
    ets = select_tokens(**b, config=SelectionConfig(method="ets", ratio=0.2, scope="micro_batch"))
    gmts = select_tokens(**b, config=SelectionConfig(method="gmts", ratio=0.2, scope="micro_batch"))
    assert not torch.equal(ets.mask, gmts.mask)


def test_gmts_exact_uses_grad_norm_and_requires_it():
    b = _batch(seed=4)
    grad_norm = torch.rand_like(b["entropy"])
    cfg = SelectionConfig(method="gmts_exact", ratio=0.3, scope="micro_batch")
    sel = select_tokens(**b, grad_norm=grad_norm, config=cfg)
    gmts = select_tokens(**b, config=SelectionConfig(method="gmts", ratio=0.3, scope="micro_batch"))
    torch.testing.assert_close(sel.scores / grad_norm.clamp_min(1e-12), gmts.scores / b["entropy"], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="grad_norm"):
        select_tokens(**b, config=cfg)


def test_g_norm_keeps_the_tokens_whose_logit_gradient_is_largest():
    """G_t = ‖e_o − p‖ computed here from logits by hand: per group, the top ⌈ρ·n⌉ tokens by it, nothing else."""
    b = _batch(seed=6)
    logits = torch.randn(*b["entropy"].shape, 7, generator=torch.Generator().manual_seed(6))
    tokens = torch.randint(0, 7, b["entropy"].shape, generator=torch.Generator().manual_seed(7))
    probs = logits.softmax(-1)
    grad_norm = (torch.nn.functional.one_hot(tokens, 7).float() - probs).norm(dim=-1)
    sel = select_tokens(**b, grad_norm=grad_norm, config=SelectionConfig(method="g_norm", ratio=0.3, scope="group"))
    mask = b["response_mask"].bool()
    for g in b["group_ids"].unique():
        rows = b["group_ids"] == g
        values = grad_norm[rows][mask[rows]]
        kept = sel.mask[rows][mask[rows]]
        k = math.ceil(round(0.3 * values.numel(), 9))
        assert int(kept.sum()) == k
        assert values[kept].min() >= values[~kept].max()  # random floats: no ties
    assert not sel.mask[~mask].any()
    with pytest.raises(ValueError, match="grad_norm"):
        select_tokens(**b, config=SelectionConfig(method="g_norm", ratio=0.3))


def test_none_keeps_every_response_token():
    b = _batch(seed=5)
    sel = select_tokens(**b, config=SelectionConfig(method="none"))
    assert torch.equal(sel.mask, b["response_mask"].bool())


def test_ties_are_broken_by_a_seeded_draw_that_repeats():
    mask = torch.ones(2, 5)
    kwargs = dict(response_mask=mask, entropy=torch.ones(2, 5), advantages=torch.ones(2), group_ids=torch.tensor([0, 0]))
    config = SelectionConfig(method="ets", ratio=0.3, scope="micro_batch")
    first, again = (select_tokens(**kwargs, config=config, tie_seed=7) for _ in range(2))
    assert torch.equal(first.mask, again.mask) and int(first.mask.sum()) == 3  # ⌈0.3·10⌉
    draws = {tuple(select_tokens(**kwargs, config=config, tie_seed=s).mask.flatten().tolist()) for s in range(10)}
    assert len(draws) > 5


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["group", "micro_batch"])
def test_kept_tied_tokens_are_unbiased_in_row_position_and_advantage_sign(scope):
    """A group whose tokens all tie (a shared context): the threshold falls inside the tie. Over many
    draws every row must be kept equally often, so the kept advantages sum to ≈ 0 as the group's do
    (by position the first rows, all A > 0 here, would always win)."""
    rows, width, draws = 8, 6, 400
    advantages = torch.tensor([1.0] * 4 + [-1.0] * 4)  # GRPO: the group's advantages sum to 0
    kwargs = dict(response_mask=torch.ones(rows, width), entropy=torch.full((rows, width), 0.5),
                  advantages=advantages, group_ids=torch.zeros(rows, dtype=torch.long))
    config = SelectionConfig(method="ets", ratio=0.2, scope=scope)
    kept_per_row = torch.zeros(rows)
    signed = []
    for seed in range(draws):
        mask = select_tokens(**kwargs, config=config, tie_seed=seed).mask
        kept_per_row += mask.sum(-1)
        signed.append(float((mask.sum(-1) * advantages).sum()))
    kept = math.ceil(0.2 * rows * width)  # 10 of 48 tokens per draw
    expected = draws * kept / rows
    # Binomial sd per row ≈ sqrt(draws·kept·(1/8)(7/8)) ≈ 21; 5 sd bounds make a false failure negligible.
    assert (kept_per_row - expected).abs().max() < 5 * math.sqrt(draws * kept * (1 / rows) * (1 - 1 / rows))
    mean_signed = sum(signed) / draws
    assert abs(mean_signed) < 0.5 and max(signed) > 0 > min(signed)
    # Columns (answer positions) are drawn fairly too.
    columns = sum(select_tokens(**kwargs, config=config, tie_seed=s).mask.sum(0) for s in range(draws))
    assert (columns - draws * kept / width).abs().max() < 5 * math.sqrt(draws * kept / width)


def test_quantile_rule_keeps_ties_and_matches_torch_quantile():
    entropy = torch.tensor([[0.1, 0.5, 0.5, 0.5, 0.9]])
    kwargs = dict(response_mask=torch.ones(1, 5), entropy=entropy, advantages=torch.ones(1),
                  group_ids=torch.zeros(1, dtype=torch.long))
    sel = select_tokens(**kwargs, config=SelectionConfig(method="ets", ratio=0.6, scope="micro_batch", rule="quantile"))
    # quantile(0.4) of [0.1, 0.5, 0.5, 0.5, 0.9] = 0.5: the whole tie is kept (4 tokens, not ⌈0.6·5⌉ = 3)
    assert sel.mask.tolist() == [[False, True, True, True, True]]


def test_old_scope_name_batch_is_refused_naming_the_new_ones():
    with pytest.raises(ValidationError, match=r"scope\n.*'batch' was renamed.*micro_batch.*mini_batch"):
        SelectionConfig(method="ets", ratio=0.2, scope="batch")


def test_recipe_fixes_its_fields_and_names_a_conflicting_one():
    config = SelectionConfig(recipe="ets-release", ratio=0.2)
    assert (config.method, config.scope, config.apply_to, config.label) == ("ets", "mini_batch", "advantage", "ets-release")
    assert SelectionConfig.model_validate(config.model_dump()) == config  # a dumped config re-validates
    with pytest.raises(ValidationError, match=r"apply_to\n.*recipe 'ets-release' fixes"):
        SelectionConfig(recipe="ets-release", ratio=0.2, apply_to="loss")
    with pytest.raises(ValidationError, match=r"recipe\n.*unknown recipe 'ets-8021'"):
        SelectionConfig(recipe="ets-8021", ratio=0.2)


def test_single_token_padding_and_empty_group():
    mask = torch.tensor([[1.0, 0, 0], [0, 0, 0], [1, 1, 0]])
    kwargs = dict(response_mask=mask, entropy=torch.rand(3, 3), advantages=torch.tensor([1.0, 1.0, -1.0]),
                  group_ids=torch.tensor([0, 1, 2]), logp=torch.zeros(3, 3), old_logp=torch.zeros(3, 3))
    for method in ("ets", "gmts", "random"):
        sel = select_tokens(**kwargs, config=SelectionConfig(method=method, ratio=0.01, scope="group"))
        assert sel.mask.tolist() == [[True, False, False], [False, False, False], sel.mask[2].tolist()]
        assert int(sel.mask[2].sum()) == 1 and not (sel.mask & ~mask.bool()).any()


def test_ratio_one_keeps_every_eligible_token():
    b = _batch(seed=6)
    sel = select_tokens(**b, config=SelectionConfig(method="gmts", ratio=1.0))
    assert torch.equal(sel.mask, sel.eligible)


def test_keep_count_is_exact_for_decimal_ratios():
    n = torch.tensor([10, 5, 7, 1, 0])
    assert keep_count(n, 0.2).tolist() == [2, 1, 2, 1, 0]
    assert keep_count(torch.tensor([10]), 0.7).tolist() == [7]


def test_random_is_seeded():
    b = _batch(seed=7)
    a1 = select_tokens(**b, config=SelectionConfig(method="random", ratio=0.3, seed=1))
    a2 = select_tokens(**b, config=SelectionConfig(method="random", ratio=0.3, seed=1))
    a3 = select_tokens(**b, config=SelectionConfig(method="random", ratio=0.3, seed=2))
    assert torch.equal(a1.mask, a2.mask) and not torch.equal(a1.mask, a3.mask)


@pytest.mark.parametrize(
    "kwargs,field",
    [({"method": "gmts", "ratio": 0.0}, "ratio"), ({"method": "gmts", "ratio": 1.5}, "ratio"),
     ({"method": "magic", "ratio": 0.2}, "method"), ({"method": "ets"}, "ratio"),
     ({"method": "none", "ratio": 0.2}, "ratio"), ({"method": "ets", "ratio": 0.2, "scop": "group"}, "scop")],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValidationError, match=field):
        SelectionConfig(**kwargs)


def test_bad_inputs_raise_clear_errors():
    b = _batch()
    with pytest.raises(ValueError, match="old_logp"):
        select_tokens(**{**b, "old_logp": None}, config=SelectionConfig(method="gmts", ratio=0.2))
    with pytest.raises(ValueError, match="entropy has shape"):
        select_tokens(**{**b, "entropy": b["entropy"][:, :3]}, config=SelectionConfig(method="ets", ratio=0.2))
    with pytest.raises(ValueError, match="group_ids"):
        select_tokens(**{**b, "group_ids": torch.zeros(2)}, config=SelectionConfig(method="ets", ratio=0.2))
    with pytest.raises(ValueError, match="ref_logp"):
        select_tokens(**b, config=SelectionConfig(method="gmts", ratio=0.2), loss_config=PolicyLossConfig(kl_coef=0.1))


# ------------------------------------------------------------------- global scope, real gloo group
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _global_worker(rank, world, port, ratio, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        b = _batch(seed=10 + rank, length=6 + 3 * rank)  # ranks hold different token counts
        sel = select_tokens(**b, config=SelectionConfig(method="ets", ratio=ratio, scope="global"))
        results[rank] = (sel.mask.clone(), b["entropy"], b["response_mask"])
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # a gloo process group of real ranks
@pytest.mark.parametrize("ratio", [0.2, 0.55])
def test_global_scope_matches_single_process_ranking_over_all_ranks(ratio):
    world = 2
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_global_worker, args=(world, _free_port(), ratio, results), nprocs=world, join=True)
    masks = [results[r][0] for r in range(world)]
    scores = torch.cat([results[r][1][results[r][2].bool()] for r in range(world)])
    chosen = torch.cat([results[r][1][masks[r]] for r in range(world)])
    assert chosen.numel() == math.ceil(round(ratio * scores.numel(), 9))
    threshold = torch.sort(scores, descending=True).values[chosen.numel() - 1]
    assert chosen.min() == threshold
    # Each rank's share follows its scores, not an equal split.
    assert masks[0].sum() != masks[1].sum()


def test_a_registered_method_is_one_decorated_function_the_config_and_select_tokens_accept():
    from workers.learner.methods import is_gmts_like
    from workers.learner.selection import SELECTION_METHODS, register_selection_method

    with pytest.raises(ValueError, match="unknown selection method 'last_tokens'"):
        SelectionConfig(method="last_tokens", ratio=0.5)

    @register_selection_method("last_tokens")
    def last_tokens(x):  # later tokens score higher
        return torch.arange(1, x.mask.shape[1] + 1, dtype=torch.float32).expand(x.mask.shape)

    try:
        config = SelectionConfig(method="last_tokens", ratio=0.5, scope="micro_batch")
        mask = torch.ones(2, 4)
        selection = select_tokens(response_mask=mask, entropy=torch.rand(2, 4), advantages=torch.ones(2),
                                  group_ids=torch.tensor([0, 0]), config=config)
        assert selection.mask.sum() == 4 and selection.mask[:, 2:].all()  # the last half of each row
        assert not is_gmts_like("last_tokens") and is_gmts_like("gmts") and is_gmts_like("gmts-release")
    finally:
        del SELECTION_METHODS["last_tokens"]
