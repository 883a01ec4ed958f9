"""PromptSampler: distinct prompts per batch, full epochs, and a resume that replays the same batches."""

from __future__ import annotations

import json
from itertools import islice

import pytest

from orchestrator.data import PromptSampler
from workers.problem import Problem

PROBLEMS = [Problem(id=f"p{i}", prompt=f"{i}+1=", answer=str(i + 1), domain="arithmetic") for i in range(26)]


def _ids(batches: list[list[Problem]]) -> list[list[str]]:
    return [[problem.id for problem in batch] for batch in batches]


def test_batches_are_distinct_and_each_epoch_is_a_fresh_shuffle() -> None:
    sampler = PromptSampler(PROBLEMS, prompts_per_step=4, seed=0)
    assert sampler.steps_per_epoch == 6  # 26 // 4: two problems sit out each epoch
    epochs = [_ids(list(islice(sampler, 6))) for _ in range(3)]
    for epoch in epochs:
        assert all(len(batch) == 4 for batch in epoch)
        seen = [problem_id for batch in epoch for problem_id in batch]
        assert len(set(seen)) == 24  # no problem twice within an epoch
    assert epochs[0] != epochs[1] != epochs[2]
    assert sampler.epoch == 2 and sampler.position == 6


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    first = _ids(list(islice(PromptSampler(PROBLEMS, 5, seed=1), 12)))
    again = _ids(list(islice(PromptSampler(PROBLEMS, 5, seed=1), 12)))
    other = _ids(list(islice(PromptSampler(PROBLEMS, 5, seed=2), 12)))
    assert first == again and first != other


@pytest.mark.parametrize("stop_after", [1, 5, 6, 7, 13])  # mid-epoch, at an epoch's end, past it
def test_resume_sees_exactly_the_uninterrupted_batches(stop_after: int) -> None:
    uninterrupted = _ids(list(islice(PromptSampler(PROBLEMS, 4, seed=3), 20)))

    before = PromptSampler(PROBLEMS, 4, seed=3)
    head = _ids(list(islice(before, stop_after)))
    checkpoint = json.loads(json.dumps(before.state_dict()))  # as it would be stored

    resumed = PromptSampler(PROBLEMS, 4, seed=999)  # the checkpoint's seed wins
    resumed.load_state_dict(checkpoint)
    tail = _ids(list(islice(resumed, 20 - stop_after)))
    assert head + tail == uninterrupted


def test_resume_with_other_data_or_batch_size_is_refused() -> None:
    state = PromptSampler(PROBLEMS, 4, seed=0).state_dict()
    with pytest.raises(ValueError, match="num_problems"):
        PromptSampler(PROBLEMS[:-1], 4).load_state_dict(state)
    with pytest.raises(ValueError, match="fingerprint"):
        PromptSampler(list(reversed(PROBLEMS)), 4).load_state_dict(state)
    with pytest.raises(ValueError, match="prompts_per_step"):
        PromptSampler(PROBLEMS, 5).load_state_dict(state)
    with pytest.raises(ValueError, match="position"):
        PromptSampler(PROBLEMS, 4).load_state_dict(state | {"position": 7})


def test_more_prompts_per_step_than_problems_is_refused() -> None:
    with pytest.raises(
        ValueError, match="prompts_per_step: 27 distinct prompts per step, but the training set holds only 26"
    ):
        PromptSampler(PROBLEMS, 27)
