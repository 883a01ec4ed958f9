import pytest
import torch

from workers.learner.batch import TrainBatch
from workers.learner.config import LearnerConfig


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


def test_from_lists_layout_column_j_is_response_token_j():
    batch = TrainBatch.from_lists([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], [1.0, -1.0], [0, 0], pad_id=0,
                                  old_logp=[[-0.5, -0.6], [-0.1, -0.2, -0.3]])
    assert batch.input_ids.tolist() == [[5, 6, 7, 1, 2], [8, 3, 4, 9, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    torch.testing.assert_close(batch.old_logp, torch.tensor([[-0.5, -0.6, 0.0], [-0.1, -0.2, -0.3]]))
    index = batch.response_index()
    # The output at position P−1+j predicts response token j, read at position P+j.
    assert index.positions.tolist() == [2, 3, 0, 1, 2]
    assert index.tokens.tolist() == [1, 2, 3, 4, 9]
    assert index.cols.tolist() == [0, 1, 0, 1, 2]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"prompt_ids": [[]], "response_ids": [[1]]}, "empty"),
        ({"prompt_ids": [[1]], "response_ids": [[1], [2]]}, "response_ids has 2 entries"),
        ({"prompt_ids": [[1]], "response_ids": [[1, 2]], "old_logp": [[0.0]]}, r"old_logp\[0\] has 1 entries"),
    ],
)
def test_from_lists_rejects_bad_input(kwargs, message):
    rows = len(kwargs["prompt_ids"])
    kwargs = {"advantages": [0.0] * rows, "group_ids": [0] * rows, "pad_id": 0} | kwargs
    with pytest.raises(ValueError, match=message):
        TrainBatch.from_lists(**kwargs)


def _group_sets(pieces):
    return [set(p.group_ids.tolist()) for p in pieces]


def test_split_keeps_groups_whole_and_pieces_full():
    batch = _batch([4, 4, 4, 4, 4, 4])
    pieces = batch.split(8, generator=torch.Generator().manual_seed(1))
    assert [p.batch_size for p in pieces] == [8, 8, 8]
    seen = [gid for s in _group_sets(pieces) for gid in s]
    assert sorted(seen) == sorted(set(batch.group_ids.tolist()))  # each group in exactly one piece
    for piece in pieces:
        counts = torch.bincount(piece.group_ids - 100)
        assert set(counts[counts > 0].tolist()) == {4}


def test_split_shuffle_is_seeded_and_rows_keep_their_data():
    batch = _batch([2, 2, 2, 2, 2])
    order = lambda seed: [p.group_ids.tolist() for p in batch.split(4, torch.Generator().manual_seed(seed))]
    assert order(3) == order(3)
    assert any(order(3) != order(s) for s in range(4, 10))
    for piece in batch.split(4, torch.Generator().manual_seed(3)):
        for row in range(piece.batch_size):
            # find the original row with the same tokens: all its per-row data came along
            original = (batch.advantages == piece.advantages[row]).nonzero().item()
            width = piece.response_width
            assert torch.equal(piece.old_logp[row], batch.old_logp[original, :width])
            assert int(batch.response_mask[original, width:].sum()) == 0  # trimming cut only padding
            length = piece.input_ids.shape[1]
            assert torch.equal(piece.input_ids[row], batch.input_ids[original, :length])


def test_split_with_uneven_groups_closes_a_piece_when_the_next_group_does_not_fit():
    pieces = _batch([3, 3, 2, 1]).split(4)
    assert [p.batch_size for p in pieces] == [3, 3, 3]
    assert _group_sets(pieces) == [{100}, {101}, {102, 103}]


def test_group_larger_than_piece_is_cut_or_rejected():
    batch = _batch([2, 6, 2])
    pieces = batch.split(4)
    assert [p.batch_size for p in pieces] == [2, 4, 2, 2]
    assert _group_sets(pieces) == [{100}, {101}, {101}, {102}]  # the big group never shares a piece
    with pytest.raises(ValueError, match="has 6 sequences"):
        batch.split(4, split_large_groups=False)


def test_shard_by_whole_groups_and_concat_restores_the_batch():
    batch = _batch([4, 4, 4, 4])
    shards = batch.shard(2)
    assert [s.batch_size for s in shards] == [8, 8]
    assert set(shards[0].group_ids.tolist()).isdisjoint(shards[1].group_ids.tolist())
    joined = TrainBatch.concat(shards)
    for name in ("input_ids", "attention_mask", "prompt_lengths", "response_mask", "advantages", "group_ids",
                 "old_logp"):
        ours, theirs = getattr(joined, name), getattr(batch, name)
        assert torch.equal(ours, theirs[..., : ours.shape[-1]] if ours.dim() == 2 else theirs), name


def test_shard_rejects_what_cannot_be_split_evenly():
    with pytest.raises(ValueError, match="evenly"):
        _batch([4, 4, 4]).shard(5)
    with pytest.raises(ValueError, match="without splitting a group"):
        _batch([4, 4, 4]).shard(2)
    with pytest.raises(ValueError, match="without splitting a group"):
        _batch([3, 2, 2, 1]).shard(2)


def test_learner_config_names_the_field_in_divisibility_errors():
    LearnerConfig(num_actors=2, mini_batch_size=16, micro_batch_size=4)
    with pytest.raises(ValueError, match="micro_batch_size") as err:
        LearnerConfig(num_actors=2, mini_batch_size=16, micro_batch_size=3)
    assert err.value.errors()[0]["loc"] == ("micro_batch_size",)
    with pytest.raises(ValueError, match="mini_batch_size") as err:
        LearnerConfig(num_actors=3, mini_batch_size=16)
    assert err.value.errors()[0]["loc"] == ("mini_batch_size",)
    with pytest.raises(ValueError, match="zero_stage"):
        LearnerConfig(zero_stage=4)
    with pytest.raises(ValueError, match="extra"):
        LearnerConfig(learning_rate=1e-3)


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
    fixed = batch.split(8)  # two groups per micro-batch, a long one beside a short one
    packed = batch.pack_by_tokens(max_tokens=8 * 45)
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
    pieces = batch.pack_by_tokens(max_tokens=2 * 45)  # the long group (4 × 44 tokens) needs two pieces
    assert [p.batch_size for p in pieces] == [2, 2, 4]
    assert all(p.attention_mask.numel() <= 2 * 45 for p in pieces)
    more = batch.pack_by_tokens(max_tokens=10**6, min_pieces=3)  # one piece would do; three are asked for
    assert len(more) == 3 and sum(p.batch_size for p in more) == 8
    assert [p.group_ids.unique().tolist() for p in more] in ([[0], [0], [1]], [[0], [1], [1]])
    with pytest.raises(ValueError, match="into 9"):
        batch.pack_by_tokens(max_tokens=10**6, min_pieces=9)
