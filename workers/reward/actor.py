"""The reward Ray actor: a ``RewardScorer`` behind ``score(completions, problems)``.

A plain class, made an actor at the call site, so it stays testable without Ray::

    RemoteRewardWorker = ray.remote(num_cpus=resources.cpus_per_reward_worker)(RewardWorker)
    worker = RemoteRewardWorker.remote(config.reward)
    results = ray.get(worker.score.remote(completions, problems))

Several actors can share a batch: split it into contiguous chunks, score each on its own actor and
concatenate the results in order::

    chunk = -(-len(completions) // len(workers))
    futures = [w.score.remote(completions[i * chunk:(i + 1) * chunk], problems[i * chunk:(i + 1) * chunk])
               for i, w in enumerate(workers)]
    results = [r for part in ray.get(futures) for r in part]

Each actor owns ``config.num_workers`` verifier processes of its own: size both to the cores the
actors get. They end with the actor (``ray.kill``, or the plain object dropped): each sees EOF on its
pipe, so there is nothing to close.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.problem import Problem
from workers.reward.config import RewardConfig
from workers.reward.results import RewardResult


class RewardWorker:
    def __init__(self, config: RewardConfig):
        # Imported here, in the worker's own process, and not by the driver that only names this class: the
        # verifiers load reasoning-gym and math-verify (≈ 1 s of every run's start on one core), and they are
        # loaded before the scorer forks its verifier processes all the same.
        from workers.reward.scorer import RewardScorer

        self._scorer = RewardScorer(config)

    def score(self, completions: Sequence[str], problems: Sequence[Problem]) -> list[RewardResult]:
        return self._scorer.score(completions, problems)
