import pytest
import torch

from workers.learner.batch import TrainBatch
from workers.learner.config import LearnerConfig


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


def test_token_roles_follow_every_cut_of_the_batch():
    from workers.learner.batch import NO_ROLE, RoleLegend
    from workers.learner.schedule import shard, split_groups

    legend = RoleLegend(names=("o", "d"), decisions=frozenset({1}))
    batch = TrainBatch.from_lists([[1], [1], [1], [1]], [[5, 6, 7], [5], [5, 6], [8]], [1.0, -1.0, 0.5, 0.0],
                                  [0, 0, 1, 1], pad_id=0, token_roles=[[0, 1, 0], [1], [], [0]], role_legend=legend)
    assert batch.token_roles.tolist() == [[0, 1, 0], [1, NO_ROLE, NO_ROLE], [NO_ROLE] * 3, [0, NO_ROLE, NO_ROLE]]
    second = split_groups(batch, 2)[1]  # rows 2 and 3, trimmed to their widest response (2 tokens)
    assert second.token_roles.tolist() == [[NO_ROLE, NO_ROLE], [0, NO_ROLE]] and second.role_legend == legend
    again = TrainBatch.concat(shard(batch, 2))
    assert torch.equal(again.token_roles, batch.token_roles) and again.role_legend == legend
    assert again.to("cpu").role_legend == legend
    plain = TrainBatch.from_lists([[1]], [[5]], [1.0], [0], pad_id=0)
    assert TrainBatch.concat([plain, plain]).token_roles is None
    with pytest.raises(ValueError, match="come together"):
        batch.replace(role_legend=None)
    with pytest.raises(ValueError, match="token_roles\\[0\\] has 2 entries"):
        TrainBatch.from_lists([[1]], [[5, 6, 7]], [1.0], [0], pad_id=0, token_roles=[[0, 1]], role_legend=legend)


def test_staleness_follows_every_cut_of_the_batch():
    from workers.learner.schedule import shard, split_groups

    batch = TrainBatch.from_lists([[1], [1], [1], [1]], [[5, 6], [5], [5, 6], [8]], [1.0, -1.0, 0.5, 0.0],
                                  [0, 0, 1, 1], pad_id=0, staleness=[0, 0, 2, 2])
    assert batch.staleness.tolist() == [0, 0, 2, 2] and batch.is_stale
    assert split_groups(batch, 2)[1].staleness.tolist() == [2, 2] and not split_groups(batch, 2)[0].is_stale
    assert torch.equal(TrainBatch.concat(shard(batch, 2)).staleness, batch.staleness)
    plain = TrainBatch.from_lists([[1]], [[5]], [1.0], [0], pad_id=0)
    assert plain.staleness is None and not plain.is_stale
    # A batch without it is on-policy, beside one with it too.
    assert TrainBatch.concat([plain, batch]).staleness.tolist() == [0, 0, 0, 2, 2]
    assert TrainBatch.concat([plain, plain]).staleness is None
    with pytest.raises(ValueError, match="staleness has 1 entries"):
        TrainBatch.from_lists([[1], [1]], [[5], [6]], [1.0, 0.0], [0, 0], pad_id=0, staleness=[1])
    with pytest.raises(ValueError, match=r"TrainBatch.staleness has shape \(3,\)"):
        batch.replace(staleness=torch.zeros(3, dtype=torch.long))
