"""A run's actors: the rollout engines, the learner ranks, the reward worker and the weight sync between them.

Each sits in the bundle ``orchestrator.resources`` sized for it when the run has a placement group (a sweep
trial's, or the one ``train`` reserves for colocated pairs), else where Ray puts it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import ray

from orchestrator.cluster import actor_runtime_env
from orchestrator.config import ExperimentConfig
from orchestrator.resources import bundle_index
from workers.learner.group import LearnerGroup
from workers.placement import in_bundle
from workers.reward.actor import RewardWorker
from workers.rollout.actor import RolloutGroup
from workers.weights.sync import WeightSync

logger = logging.getLogger(__name__)


@dataclass
class Workers:
    rollout: RolloutGroup
    learners: LearnerGroup
    reward: ray.actor.ActorHandle
    weights: WeightSync
    reward_failures: int = 0  # verifier errors and timeouts so far (each scored 0, never fatal)

    def score(self, completions: list[str], problems: list) -> list[float]:
        results = ray.get(self.reward.score.remote(completions, problems))
        self.reward_failures += sum(result.error is not None for result in results)
        return [result.score for result in results]

    def shutdown(self) -> None:
        for stop in (self.rollout.shutdown, self.learners.shutdown, lambda: ray.kill(self.reward)):
            try:
                stop()
            except Exception:  # best effort: the run is over either way
                logger.debug("shutdown step failed", exc_info=True)


def start_workers(config: ExperimentConfig, policy_dir: Path, placement_group) -> Workers:
    """Every actor of the run, up and connected (the weight sync's group joined on the collective route); on a
    failure the ones already started are stopped."""
    res = config.resources
    env = actor_runtime_env()
    rollout = learners = reward = None
    try:
        rollout = RolloutGroup(
            policy_dir, config.rollout, num_cpus_per_actor=res.cpus_per_rollout_actor,
            num_gpus_per_actor=res.gpus_per_rollout_actor, placement_group=placement_group,
            bundle_indices=[bundle_index(config, "rollout", r) for r in range(config.rollout.num_actors)],
            runtime_env=env, dtype="bfloat16" if config.learner.bf16 else None,  # vLLM computes as the learner does
        )
        learners = LearnerGroup(
            policy_dir, config.learner, config.algorithm.loss, config.selection,
            temperature=config.rollout.temperature, use_reference=config.algorithm.loss.kl_coef > 0,
            num_cpus_per_actor=res.cpus_per_learner_actor, num_gpus_per_actor=res.gpus_per_learner_actor,
            placement_group=placement_group, bundle_offset=bundle_index(config, "learner", 0),
        )
        reward = ray.remote(RewardWorker).options(
            num_cpus=res.cpus_per_reward_worker, runtime_env=env,
            **in_bundle(placement_group, bundle_index(config, "reward", 0))).remote(config.reward)
        weights = WeightSync(learners.actors, rollout.actors, config.rollout.weight_sync_bucket_bytes)
    except BaseException:
        for group in (rollout, learners):
            if group is not None:
                group.shutdown()
        if reward is not None:
            ray.kill(reward)
        raise
    return Workers(rollout=rollout, learners=learners, reward=reward, weights=weights)
