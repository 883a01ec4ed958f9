"""Rollouts: vLLM engines that sample response groups with logprobs and take new weights in place.

The Ray side (``RolloutActor``, ``RolloutGroup``) lives in ``workers.rollout.actor``.
"""

from workers.rollout.config import RolloutConfig
from workers.rollout.engine import RolloutEngine, RolloutSample

__all__ = ["RolloutConfig", "RolloutEngine", "RolloutSample"]
