"""The Ray resource bundles of one training run, in one fixed order.

Bundle 0 is the driver (the RL loop itself; a Tune trial's function runs there), then one bundle
per rollout actor, then one per learner actor; with ``resources.colocate`` one bundle per
(rollout engine r, learner rank r) pair instead, which is how an engine and a learner share a GPU.
Sweeps build a trial's ``PlacementGroupFactory`` from :func:`run_bundles`; the loop places its actors
by :func:`bundle_index` in the same group, so a trial can never take more of the cluster than its
placement group holds.
"""

from __future__ import annotations

from typing import Literal

from orchestrator.config import ExperimentConfig

# Ray rejects empty bundles; the driver mostly waits on actors, so it asks for a sliver of a CPU.
DRIVER_CPUS = 0.01


def run_bundles(config: ExperimentConfig) -> list[dict[str, float]]:
    res = config.resources
    driver = [{"CPU": DRIVER_CPUS}]
    if res.colocate:  # the config checked: as many engines as learner ranks, each pair within one GPU
        pair = _bundle(res.cpus_per_rollout_actor + res.cpus_per_learner_actor,
                       res.gpus_per_rollout_actor + res.gpus_per_learner_actor)
        return driver + [dict(pair) for _ in range(config.learner.num_actors)]
    rollout = _bundle(res.cpus_per_rollout_actor, res.gpus_per_rollout_actor)
    learner = _bundle(res.cpus_per_learner_actor, res.gpus_per_learner_actor)
    return driver + [dict(rollout) for _ in range(config.rollout.num_actors)] + [
        dict(learner) for _ in range(config.learner.num_actors)
    ]


def bundle_index(config: ExperimentConfig, role: Literal["rollout", "learner"], rank: int) -> int:
    if role == "rollout" or config.resources.colocate:
        return 1 + rank
    return 1 + config.rollout.num_actors + rank


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    bundle = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = gpus
    return bundle
