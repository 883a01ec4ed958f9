"""Rollout engines as Ray actors, and a group that shares prompts among them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import ray
import torch
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from workers.weights.object_store import HostWeights
from workers.rollout.config import RolloutConfig
from workers.rollout.engine import RolloutEngine, RolloutSample

logger = logging.getLogger(__name__)

# The caller sizes it: RolloutActor.options(num_cpus=…, num_gpus=…).remote(model_dir, config).
RolloutActor = ray.remote(RolloutEngine)


class RolloutGroup:
    """``config.num_actors`` rollout actors; prompts are split into contiguous chunks, one per actor."""

    def __init__(
        self,
        model_dir: str | Path,
        config: RolloutConfig,
        num_cpus_per_actor: float = 1,
        num_gpus_per_actor: float = 0,
        placement_group: PlacementGroup | None = None,
        bundle_indices: list[int] | None = None,
        runtime_env: dict | None = None,
        dtype: str | None = None,
    ) -> None:
        """``placement_group``/``bundle_indices``: where each actor goes (a sweep trial's own group);
        ``dtype``: what the engines compute in (None = the model folder's dtype)."""
        self.config = config
        if placement_group is not None and (bundle_indices is None or len(bundle_indices) != config.num_actors):
            raise ValueError(f"bundle_indices must name one bundle per rollout actor ({config.num_actors})")
        self.actors = []
        for rank in range(config.num_actors):
            options: dict = {"num_cpus": num_cpus_per_actor, "num_gpus": num_gpus_per_actor}
            if runtime_env is not None:
                options["runtime_env"] = runtime_env
            if placement_group is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=placement_group, placement_group_bundle_index=bundle_indices[rank])
            self.actors.append(RolloutActor.options(**options).remote(str(model_dir), config, dtype))

    def generate(
        self, prompt_token_ids: list[list[int]], n: int, greedy: bool = False, seed: int | None = None
    ) -> list[RolloutSample]:
        """Same contract as ``RolloutEngine.generate``: samples grouped by prompt, in prompt order."""
        chunks = _contiguous_chunks(len(prompt_token_ids), len(self.actors))
        pending = [
            (start, actor.generate.remote(prompt_token_ids[start:stop], n, greedy,
                                          None if seed is None else seed + start))
            for actor, (start, stop) in zip(self.actors, chunks)
            if stop > start
        ]
        samples: list[RolloutSample] = []
        for start, ref in pending:
            # Each actor numbers its chunk's prompts from 0; shift back to the caller's numbering.
            samples.extend(replace(s, prompt_index=s.prompt_index + start) for s in ray.get(ref))
        return samples

    def update_weights(self, weights: Mapping[str, torch.Tensor] | ray.ObjectRef) -> list[float]:
        """Send the same weights to every actor; returns each actor's reload seconds.

        ``weights``: a state dict, or a reference to one already in the object store (a learner's
        ``HostWeights``, see ``LearnerGroup.weights_for_rollout``). A state dict goes into the store once,
        as HostWeights; every actor maps that one copy.
        """
        if not isinstance(weights, ray.ObjectRef):
            weights = ray.put(HostWeights(weights.items()))
        return ray.get([actor.update_weights.remote(weights) for actor in self.actors])

    def weight_sync_route(self) -> str:
        """How weights reach these engines ('in_process', 'bytes' or 'collective'): one config, one answer."""
        return ray.get(self.actors[0].weight_sync_route.remote())

    # ------------------------------------------ collective weight sync (see workers/weights/broadcast.py)
    # join_weight_sync_group and receive_weights return Ray ObjectRefs: they are collectives with the
    # learner rank 0, so the caller must ray.get them together with the learner side's calls.
    def weight_sync_devices(self) -> list[str | None]:
        """Every vLLM worker's GPU (None on CPU), engines in order: the group's ranks 1, 2, …"""
        return [device for devices in ray.get([a.weight_sync_devices.remote() for a in self.actors])
                for device in devices]

    def join_weight_sync_group(self, host: str, port: int, world_size: int, backend: str) -> list[ray.ObjectRef]:
        """Engine i's workers take ranks 1 + (ranks of engines before i) + their own rank."""
        counts = [len(devices) for devices in ray.get([a.weight_sync_devices.remote() for a in self.actors])]
        offsets = [1 + sum(counts[:i]) for i in range(len(counts))]
        return [actor.join_weight_sync_group.remote(host, port, offset, world_size, backend)
                for actor, offset in zip(self.actors, offsets)]

    def receive_weights(self) -> list[ray.ObjectRef]:
        return [actor.receive_weights.remote() for actor in self.actors]

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def _contiguous_chunks(num_items: int, num_chunks: int) -> list[tuple[int, int]]:
    """Split range(num_items) into num_chunks contiguous (start, stop) ranges whose sizes differ by ≤ 1."""
    base, extra = divmod(num_items, num_chunks)
    bounds = [0]
    for index in range(num_chunks):
        bounds.append(bounds[-1] + base + (1 if index < extra else 0))
    return list(pairwise(bounds))
