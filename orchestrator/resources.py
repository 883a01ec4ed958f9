"""The Ray resource bundles of one training run, in one fixed order.

Bundle 0 is the driver (the RL loop itself; a Tune trial's function runs there), then one bundle
per rollout actor, then one per learner actor; with ``resources.colocate`` one bundle per
(rollout engine r, learner rank r) pair instead, which is how an engine and a learner share a GPU.
Last, when ``resources.cpus_per_reward_worker`` > 0, a bundle of its own for the reward actor: Tune
gives a trial's function the whole of bundle 0, so a reward actor asking for CPUs there would wait
forever; at 0 (the default) the actor needs nothing and shares bundle 0.
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
    reward = [{"CPU": res.cpus_per_reward_worker}] if res.cpus_per_reward_worker else []
    if res.colocate:  # the config checked: as many engines as learner ranks, each pair within one GPU
        pair = _bundle(res.cpus_per_rollout_actor + res.cpus_per_learner_actor,
                       res.gpus_per_rollout_actor + res.gpus_per_learner_actor)
        return driver + [dict(pair) for _ in range(config.learner.num_actors)] + reward
    rollout = _bundle(res.cpus_per_rollout_actor, res.gpus_per_rollout_actor)
    learner = _bundle(res.cpus_per_learner_actor, res.gpus_per_learner_actor)
    return driver + [dict(rollout) for _ in range(config.rollout.num_actors)] + [
        dict(learner) for _ in range(config.learner.num_actors)
    ] + reward


def bundle_index(config: ExperimentConfig, role: Literal["rollout", "learner", "reward"], rank: int) -> int:
    if role == "reward":  # its own last bundle, or the driver's when it asks for no CPU
        return len(run_bundles(config)) - 1 if config.resources.cpus_per_reward_worker else 0
    if role == "rollout" or config.resources.colocate:
        return 1 + rank
    return 1 + config.rollout.num_actors + rank


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    bundle = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = gpus
    return bundle
