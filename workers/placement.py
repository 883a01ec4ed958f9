"""Where a worker actor goes: the Ray options that put it in one bundle of a run's placement group.

Every actor of a run (rollout engines, learner ranks, reward worker) sits in the bundle that
``orchestrator.resources`` sized for it, so a sweep trial's actors stay inside its own placement group.
"""

from __future__ import annotations

from typing import Any

from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


def in_bundle(placement_group: PlacementGroup | None, bundle_index: int) -> dict[str, Any]:
    """``.options(**in_bundle(group, i))``: bundle ``i`` of ``group``; no option (Ray's default placement) without
    a group."""
    if placement_group is None:
        return {}
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=placement_group, placement_group_bundle_index=bundle_index)}
