"""Rollouts of the next steps, collected while the learners train (``rollout.max_staleness``).

With ``max_staleness`` k > 0 the driver holds the batches of the next k steps. At step t it hands batch t to the
learners and, while they train, collects batch t+k on a background thread with the engines' current weights,
version t−1 (version v = the weights after v learner steps). The weights change only between collections: the
driver waits for the collection in flight (:meth:`RolloutAhead.settle`) before it syncs. So batch t+k is sampled by
exactly version t−1 and trained at step t+k by the learner at version t+k−1: k versions behind, every time (the
first k batches, collected before step 1 by version 0, lag 0 … k−1). Which weights sample which batch is fixed by
the step numbers, never by timing: same config + seed → same batches. A step then costs about
max(rollout, learner) + sync instead of their sum (PRIME-RL's ``async_level``, verl's one-step-off-policy trainer
for k = 1).

k = 0 collects each batch when its step asks for it, on the driver's own thread: the synchronous loop.

A batch is :class:`Rollouts`: one step's sequences grouped by prompt, with their rewards (the driver's step,
orchestrator/rl_step.py, collects and trains them). The batches held at a checkpoint are part of the run's state
(:meth:`RolloutAhead.state_dict`): a resumed run trains on the very batches the uninterrupted one would have, sampled
by the same older weights.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from workers.problem import Problem
from workers.rollout.engine import RolloutSample

@dataclass
class Rollouts:
    """Sequences of one step, grouped by prompt (a group's samples are adjacent)."""

    samples: list[RolloutSample] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # one per sample
    group_ids: list[int] = field(default_factory=list)  # one per sample
    rewards: list[float] = field(default_factory=list)  # shaped (what the advantages use)
    correct: list[float] = field(default_factory=list)  # verifier scores alone
    generate_seconds: float = 0.0
    reward_seconds: float = 0.0

    def extend(self, other: Rollouts, keep: list[bool]) -> None:
        for index, flag in enumerate(keep):
            if flag:
                self.samples.append(other.samples[index])
                self.problems.append(other.problems[index])
                self.group_ids.append(other.group_ids[index])
                self.rewards.append(other.rewards[index])
                self.correct.append(other.correct[index])

    @property
    def num_groups(self) -> int:
        return len(set(self.group_ids))


# collect(first group id) → (rollouts, metrics, next group id): one step's batch (orchestrator.rl_step.collect)
Collect = Callable[[int], tuple[Rollouts, dict[str, float], int]]


@dataclass
class Collected:
    """One step's batch with the metrics of its collection and the policy version that sampled it."""

    rollouts: Rollouts
    metrics: dict[str, float]
    version: int

    def to_state(self) -> dict[str, Any]:
        r = self.rollouts
        return {"version": self.version, "metrics": self.metrics,
                "samples": [asdict(s) for s in r.samples], "problems": [p.model_dump(mode="json") for p in r.problems],
                "group_ids": r.group_ids, "rewards": r.rewards, "correct": r.correct,
                "generate_seconds": r.generate_seconds, "reward_seconds": r.reward_seconds}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Collected:
        rollouts = Rollouts(
            samples=[RolloutSample(**s) for s in state["samples"]],
            problems=[Problem.model_validate(p) for p in state["problems"]],
            group_ids=state["group_ids"], rewards=state["rewards"], correct=state["correct"],
            generate_seconds=state["generate_seconds"], reward_seconds=state["reward_seconds"])
        return cls(rollouts=rollouts, metrics=state["metrics"], version=state["version"])


class RolloutAhead:
    """The batches of the next ``max_staleness`` steps (module docstring)."""

    def __init__(self, collect: Collect, max_staleness: int, next_group_id: int = 0,
                 held: list[Collected] | None = None) -> None:
        """``next_group_id``: the first group id not yet collected; ``held``: the batches a checkpoint held."""
        if held and len(held) != max_staleness:
            # Dropping them would skip their prompts; training them would lag past (or short of) the bound.
            raise ValueError(f"rollout.max_staleness={max_staleness}, but the checkpoint holds {len(held)} batches "
                             f"collected ahead: resume with rollout.max_staleness={len(held)}")
        self._collect = collect
        self.max_staleness = max_staleness
        self.next_group_id = next_group_id
        self._ready: deque[Collected] = deque(held or ())
        self._in_flight: Future[Collected] | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead") if max_staleness else None

    def take(self, version: int) -> Collected:
        """The batch of the step that trains the weights of ``version``; with max_staleness k, also starts
        collecting the batch of k steps later, with the engines' weights (``version``), in the background."""
        if self._thread is None:
            return self._run(version)
        if self._in_flight is not None:
            raise RuntimeError("RolloutAhead.take: the previous step's collection was never settled")
        while len(self._ready) < self.max_staleness:  # the first step (or a checkpoint without held batches)
            self._ready.append(self._run(version))
        self._in_flight = self._thread.submit(self._run, version)
        return self._ready.popleft()

    def settle(self) -> float:
        """Wait for the collection in flight: call before the engines' weights change. Returns the seconds
        waited (the rollout time the learner's step did not hide)."""
        if self._in_flight is None:
            return 0.0
        started = time.perf_counter()
        try:
            self._ready.append(self._in_flight.result())
        finally:
            self._in_flight = None
        return time.perf_counter() - started

    def _run(self, version: int) -> Collected:
        rollouts, metrics, self.next_group_id = self._collect(self.next_group_id)
        return Collected(rollouts=rollouts, metrics=metrics, version=version)

    def state_dict(self) -> dict[str, Any]:
        """The held batches and the next group id (JSON); only between steps, when nothing is in flight."""
        if self._in_flight is not None:
            raise RuntimeError("RolloutAhead.state_dict: a collection is in flight (settle first)")
        return {"next_group_id": self.next_group_id, "held": [c.to_state() for c in self._ready]}

    @staticmethod
    def held_from(state: dict[str, Any]) -> list[Collected]:
        return [Collected.from_state(c) for c in state.get("held", [])]

    def close(self) -> None:
        """Stop collecting ahead (a run that ends or fails): a collection in flight is left to fail with its
        engines, which the run shuts down next."""
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
