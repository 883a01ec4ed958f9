"""RolloutAhead's schedule: which weights sample which step's batch, what a checkpoint holds, what fails where.

The collect function here stands in for orchestrator.rl_step.collect (engines and verifiers), which the
end-to-end tests run for real (tests/orchestrator/test_train_e2e.py): this checks the bookkeeping alone.
"""

from __future__ import annotations

import json
import threading

import pytest

from orchestrator.config_loader import ConfigError, load_experiment
from orchestrator.rollout_ahead import RolloutAhead, Rollouts
from workers.problem import Problem
from workers.rollout.engine import RolloutSample

GROUPS_PER_STEP = 2


def _collect_with(engine_version: list[int], log: list[tuple[int, int]], fail_at: int | None = None):
    """One step's batch: a sample per group whose logprob records the engines' weights at collection time."""

    def collect(first_group_id: int):
        if first_group_id == fail_at:
            raise RuntimeError("engine died")
        log.append((first_group_id, engine_version[0]))
        group_ids = list(range(first_group_id, first_group_id + GROUPS_PER_STEP))
        samples = [RolloutSample(prompt_index=i, prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.5 * g],
                                 finish_reason="stop") for i, g in enumerate(group_ids)]
        problems = [Problem(id=f"p{g}", prompt="1+1", answer="2", domain="arithmetic") for g in group_ids]
        rollouts = Rollouts(samples=samples, problems=problems, group_ids=group_ids, rewards=[1.0, 0.0],
                            correct=[1.0, 0.0], generate_seconds=0.1, reward_seconds=0.0)
        return rollouts, {"train/accuracy": 0.5, "collected_by": float(engine_version[0])}, first_group_id + GROUPS_PER_STEP

    return collect


def _drive(ahead: RolloutAhead, engine_version: list[int], steps: range) -> list[tuple[int, int]]:
    """The driver's loop: take, (train), settle, sync. Returns (first group id, staleness) per step."""
    trained = []
    for step in steps:
        batch = ahead.take(version=step - 1)
        assert batch.metrics["collected_by"] == batch.version  # the version is the engines' at collection
        trained.append((batch.rollouts.group_ids[0], step - 1 - batch.version))
        ahead.settle()
        engine_version[0] = step  # the sync after the step's update
    return trained


@pytest.mark.parametrize("k", [0, 1, 2])
def test_each_step_trains_the_next_batch_exactly_k_versions_behind(k):
    version, log = [0], []
    ahead = RolloutAhead(_collect_with(version, log), max_staleness=k)
    try:
        trained = _drive(ahead, version, range(1, 7))
    finally:
        ahead.close()
    # Batches in order, none skipped or repeated; staleness 0 … k−1 while the first k batches drain, then k.
    assert [first for first, _ in trained] == [GROUPS_PER_STEP * i for i in range(6)]
    assert [lag for _, lag in trained] == [min(i, k) for i in range(6)]
    assert len(log) == 6 + k  # k batches collected ahead of the last step


def test_collecting_ahead_runs_while_the_driver_trains():
    """With k ≥ 1 the next batch is collected on another thread between take() and settle()."""
    started, release = threading.Event(), threading.Event()
    version, log = [0], []
    plain = _collect_with(version, log)

    def slow_collect(first_group_id):
        if first_group_id >= GROUPS_PER_STEP:  # the collection ahead, not the initial fill
            started.set()
            assert release.wait(10)
        return plain(first_group_id)

    ahead = RolloutAhead(slow_collect, max_staleness=1)
    try:
        ahead.take(version=0)
        assert started.wait(10)  # collecting while this thread is free to train
        release.set()
        ahead.settle()
    finally:
        ahead.close()


def test_a_checkpoint_holds_the_batches_ahead_and_resuming_trains_the_same_ones():
    version, log = [0], []
    uninterrupted = RolloutAhead(_collect_with(version, log), max_staleness=2)
    try:
        full = _drive(uninterrupted, version, range(1, 7))
    finally:
        uninterrupted.close()

    version, log = [0], []
    first = RolloutAhead(_collect_with(version, log), max_staleness=2)
    _drive(first, version, range(1, 4))
    state = json.loads(json.dumps(first.state_dict()))  # what run_state.json stores
    first.close()
    assert state["next_group_id"] == GROUPS_PER_STEP * 5 and len(state["held"]) == 2
    resumed = RolloutAhead(_collect_with(version, log), max_staleness=2, next_group_id=state["next_group_id"],
                           held=RolloutAhead.held_from(state))
    try:
        rest = _drive(resumed, version, range(4, 7))
    finally:
        resumed.close()
    assert rest == full[3:]
    with pytest.raises(ValueError, match="resume with rollout.max_staleness=2"):
        RolloutAhead(_collect_with(version, log), max_staleness=0, held=RolloutAhead.held_from(state))
    restored = RolloutAhead.held_from(state)[0].rollouts
    assert restored.samples[1].response_logprobs == [-0.5 * (GROUPS_PER_STEP * 3 + 1)]
    assert restored.problems[0].id == f"p{GROUPS_PER_STEP * 3}"


def test_a_failed_collection_ahead_fails_the_step_that_waits_for_it():
    version, log = [0], []
    ahead = RolloutAhead(_collect_with(version, log, fail_at=GROUPS_PER_STEP), max_staleness=1)
    try:
        ahead.take(version=0)
        with pytest.raises(RuntimeError, match="in flight"):  # no checkpoint of a half-known state
            ahead.state_dict()
        with pytest.raises(RuntimeError, match="engine died"):
            ahead.settle()
        assert ahead.state_dict()["next_group_id"] == GROUPS_PER_STEP  # the failed batch is not counted
    finally:
        ahead.close()


def test_staleness_needs_the_engines_logprobs_as_pi_old():
    with pytest.raises(ConfigError, match=r"max_staleness=1.*old_logp_source='rollout'"):
        load_experiment("cpu-tiny-s", ["rollout.max_staleness=1"])
    config = load_experiment("cpu-tiny-s", ["rollout.max_staleness=1", "learner.old_logp_source=rollout"])
    assert config.rollout.max_staleness == 1
    with pytest.raises(ConfigError, match="max_staleness"):
        load_experiment("cpu-tiny-s", ["rollout.max_staleness=-1"])
