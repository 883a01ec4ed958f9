import torch

from workers.learner.config import LearnerConfig
from workers.learner.schedule import loss_units, needs_reference_pass, needs_scoring_pass, row_spans, stack_rows
from workers.learner.selection import SelectionConfig


def test_loss_units_count_tokens_or_answered_sequences():
    mask = torch.tensor([[1.0, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert loss_units(mask, "token-mean") == 3.0
    assert loss_units(mask, "seq-mean-token-mean") == loss_units(mask, "seq-mean-token-sum-norm") == 2.0


def test_scoring_pass_only_for_step_wide_scopes_with_several_micro_batches():
    for scope, needed in (("group", False), ("micro_batch", False), ("global_micro_batch", False),
                          ("mini_batch", True), ("global", True)):
        config = SelectionConfig(method="ets", ratio=0.2, scope=scope)
        assert needs_scoring_pass(config, 3) is needed
        assert needs_scoring_pass(config, 1) is False  # one micro-batch: its training forward scores it all
    assert needs_scoring_pass(SelectionConfig(method="none", scope="mini_batch"), 3) is False


def test_stack_rows_pads_and_row_spans_find_each_part_again():
    parts = [torch.ones(2, 3), 2 * torch.ones(1, 5)]
    stacked = stack_rows(parts)
    assert stacked.shape == (3, 5) and stacked[:2, 3:].eq(0).all()
    for (start, stop, width), part in zip(row_spans(parts), parts):
        assert torch.equal(stacked[start:stop, :width], part)
    assert torch.equal(stack_rows([torch.tensor([1, 2]), torch.tensor([3])]), torch.tensor([1, 2, 3]))
    assert stack_rows([torch.ones(1, 1), None]) is None


def test_reference_pass_only_when_the_update_is_more_than_one_on_policy_step_or_kl_needs_pi_ref():
    one_step = LearnerConfig(mini_batch_size=16, micro_batch_size=4)
    assert needs_reference_pass(one_step, rows=16, kl_coef=0.0) is False
    assert needs_reference_pass(one_step, rows=12, kl_coef=0.0) is False  # dynamic sampling kept fewer rows
    assert needs_reference_pass(one_step, rows=16, kl_coef=0.01) is True  # KL reads π_ref
    assert needs_reference_pass(one_step, rows=32, kl_coef=0.0) is True  # two optimiser steps
    two_epochs = one_step.model_copy(update={"ppo_epochs": 2})
    assert needs_reference_pass(two_epochs, rows=16, kl_coef=0.0) is True
    two_ranks = LearnerConfig(num_actors=2, mini_batch_size=16, micro_batch_size=4)  # 8 rows per rank and step
    assert needs_reference_pass(two_ranks, rows=8, kl_coef=0.0) is False
    assert needs_reference_pass(two_ranks, rows=16, kl_coef=0.0) is True
