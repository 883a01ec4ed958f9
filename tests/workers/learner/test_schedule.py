import pytest
import torch

from workers.learner.batch import TrainBatch
from workers.learner.config import LearnerConfig
from workers.learner.schedule import (loss_scale, loss_units, needs_reference_pass, needs_scoring_pass, pack_by_tokens,
                                      row_spans, schedule_units, shard, split_groups, stack_rows)
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


def test_micro_batch_scales_add_up_to_one_over_the_mini_batch():
    batch = _batch([3, 3, 2])
    for loss_agg in ("token-mean", "seq-mean-token-mean"):
        shape, units = schedule_units([split_groups(batch, 3)], loss_agg)
        assert shape == [3] and units[0] == loss_units(batch.response_mask, loss_agg)
        scales = [loss_scale(m.response_mask, loss_agg, units[0]) for m in split_groups(batch, 3)]
        assert sum(scales) == pytest.approx(1.0)


def _batch(group_sizes, seed=0, with_logp=True) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    prompts, responses, group_ids = [], [], []
    for group, size in enumerate(group_sizes):
        prompt = torch.randint(1, 20, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g).tolist()
        for _ in range(size):
            prompts.append(prompt)
            responses.append(torch.randint(1, 20, (int(torch.randint(0, 6, (1,), generator=g)),), generator=g).tolist())
            group_ids.append(100 + group)
    logp = [[-0.1 * (j + 1) for j in range(len(r))] for r in responses] if with_logp else None
    return TrainBatch.from_lists(prompts, responses, torch.randn(len(prompts), generator=g), group_ids, pad_id=0,
                                 old_logp=logp)


def _group_sets(pieces):
    return [set(p.group_ids.tolist()) for p in pieces]


def test_split_groups_keeps_groups_whole_and_pieces_full():
    batch = _batch([4, 4, 4, 4, 4, 4])
    pieces = split_groups(batch, 8, generator=torch.Generator().manual_seed(1))
    assert [p.batch_size for p in pieces] == [8, 8, 8]
    seen = [gid for s in _group_sets(pieces) for gid in s]
    assert sorted(seen) == sorted(set(batch.group_ids.tolist()))  # each group in exactly one piece
    for piece in pieces:
        counts = torch.bincount(piece.group_ids - 100)
        assert set(counts[counts > 0].tolist()) == {4}


def test_split_groups_shuffle_is_seeded_and_rows_keep_their_data():
    batch = _batch([2, 2, 2, 2, 2])
    order = lambda seed: [p.group_ids.tolist() for p in split_groups(batch, 4, torch.Generator().manual_seed(seed))]
    assert order(3) == order(3)
    assert any(order(3) != order(s) for s in range(4, 10))
    for piece in split_groups(batch, 4, torch.Generator().manual_seed(3)):
        for row in range(piece.batch_size):
            # find the original row with the same tokens: all its per-row data came along
            original = (batch.advantages == piece.advantages[row]).nonzero().item()
            width = piece.response_width
            assert torch.equal(piece.old_logp[row], batch.old_logp[original, :width])
            assert int(batch.response_mask[original, width:].sum()) == 0  # trimming cut only padding
            length = piece.input_ids.shape[1]
            assert torch.equal(piece.input_ids[row], batch.input_ids[original, :length])


def test_split_groups_with_uneven_groups_closes_a_piece_when_the_next_group_does_not_fit():
    pieces = split_groups(_batch([3, 3, 2, 1]), 4)
    assert [p.batch_size for p in pieces] == [3, 3, 3]
    assert _group_sets(pieces) == [{100}, {101}, {102, 103}]


def test_group_larger_than_piece_is_cut_or_rejected():
    batch = _batch([2, 6, 2])
    pieces = split_groups(batch, 4)
    assert [p.batch_size for p in pieces] == [2, 4, 2, 2]
    assert _group_sets(pieces) == [{100}, {101}, {101}, {102}]  # the big group never shares a piece
    with pytest.raises(ValueError, match="has 6 sequences"):
        split_groups(batch, 4, split_large_groups=False)


def test_shard_by_whole_groups_and_concat_restores_the_batch():
    batch = _batch([4, 4, 4, 4])
    shards = shard(batch, 2)
    assert [s.batch_size for s in shards] == [8, 8]
    assert set(shards[0].group_ids.tolist()).isdisjoint(shards[1].group_ids.tolist())
    joined = TrainBatch.concat(shards)
    for name in ("input_ids", "attention_mask", "prompt_lengths", "response_mask", "advantages", "group_ids",
                 "old_logp"):
        ours, theirs = getattr(joined, name), getattr(batch, name)
        assert torch.equal(ours, theirs[..., : ours.shape[-1]] if ours.dim() == 2 else theirs), name


def test_shard_rejects_what_cannot_be_split_evenly():
    with pytest.raises(ValueError, match="evenly"):
        shard(_batch([4, 4, 4]), 5)
    with pytest.raises(ValueError, match="without splitting a group"):
        shard(_batch([4, 4, 4]), 2)
    with pytest.raises(ValueError, match="without splitting a group"):
        shard(_batch([3, 2, 2, 1]), 2)


def _mixed_length_batch(response_lengths=(40, 2, 38, 3, 2, 41, 4, 3), group_size=4, seed=0) -> TrainBatch:
    """Groups whose responses are all long or all short, long and short groups interleaved."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses, group_ids = [], [], []
    for group, length in enumerate(response_lengths):
        prompt = torch.randint(1, 20, (3,), generator=g).tolist()
        for row in range(group_size):
            prompts.append(prompt)
            responses.append(torch.randint(1, 20, (length + row % 2,), generator=g).tolist())
            group_ids.append(group)
    return TrainBatch.from_lists(prompts, responses, torch.randn(len(prompts), generator=g), group_ids, pad_id=0)


def _padded_tokens(pieces) -> int:
    return sum(piece.attention_mask.numel() for piece in pieces)


def test_pack_by_tokens_keeps_groups_whole_within_the_budget_and_pads_less():
    batch = _mixed_length_batch()
    fixed = split_groups(batch, 8)  # two groups per micro-batch, a long one beside a short one
    packed = pack_by_tokens(batch, max_tokens=8 * 45)
    for piece in packed:
        assert piece.attention_mask.numel() <= 8 * 45
        for group in piece.group_ids.unique():
            assert int((piece.group_ids == group).sum()) == 4  # whole groups
    # Every row exactly once, with its data.
    assert sorted(torch.cat([p.group_ids for p in packed]).tolist()) == sorted(batch.group_ids.tolist())
    assert sum(int(p.attention_mask.sum()) for p in packed) == int(batch.attention_mask.sum())
    # Long groups together, short groups together: far less padding than the fixed split.
    assert _padded_tokens(packed) < 0.75 * _padded_tokens(fixed), (_padded_tokens(packed), _padded_tokens(fixed))
    # Longest first, each piece filled up to the budget: two long groups; a long and a short; four short.
    assert [p.batch_size for p in packed] == [8, 8, 16]


def test_pack_by_tokens_cuts_a_group_over_the_budget_and_reaches_min_pieces():
    batch = _mixed_length_batch(response_lengths=(40, 2), group_size=4)
    pieces = pack_by_tokens(batch, max_tokens=2 * 45)  # the long group (4 × 44 tokens) needs two pieces
    assert [p.batch_size for p in pieces] == [2, 2, 4]
    assert all(p.attention_mask.numel() <= 2 * 45 for p in pieces)
    more = pack_by_tokens(batch, max_tokens=10**6, min_pieces=3)  # one piece would do; three are asked for
    assert len(more) == 3 and sum(p.batch_size for p in more) == 8
    assert [p.group_ids.unique().tolist() for p in more] in ([[0], [0], [1]], [[0], [1], [1]])
    with pytest.raises(ValueError, match="into 9"):
        pack_by_tokens(batch, max_tokens=10**6, min_pieces=9)


def test_only_the_full_token_baseline_keeps_every_token_and_it_needs_no_scoring_pass():
    from workers.learner.selection import SELECTION_METHODS

    assert [name for name, method in SELECTION_METHODS.items() if method.keeps_every_token] == ["none"]
    assert not needs_scoring_pass(SelectionConfig(method="none", scope="mini_batch"), micro_batches=4)
    assert needs_scoring_pass(SelectionConfig(method="ets", ratio=0.2, scope="mini_batch"), micro_batches=4)
