"""Rollout engines as Ray actors, and a group that shares prompts among them."""

from __future__ import annotations

import logging
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup

from workers.placement import in_bundle
from workers.rollout.config import RolloutConfig
from workers.rollout.engine import RolloutEngine, RolloutSample

logger = logging.getLogger(__name__)

# The caller sizes it: RolloutActor.options(num_cpus=…, num_gpus=…).remote(model_dir, config).
RolloutActor = ray.remote(RolloutEngine)


class RolloutGroup:
    """``config.num_actors`` rollout actors; prompts are split into contiguous chunks, one per actor. New weights
    reach them through ``workers.weights.sync`` (``WeightSync``, ``load_into_engines``), which calls ``actors``."""

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
                options.update(in_bundle(placement_group, bundle_indices[rank]))
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

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Each engine stops itself before its actor is killed: a killed engine leaves its process group's
        rendezvous file (vLLM's ``FileStore``, ``/tmp/vllm_dist_<uuid>``) behind, one per engine start. An actor
        still busy after ``grace_s`` (a cancelled run mid-generation) is killed without waiting its turn."""
        stopping = [actor.shutdown.remote() for actor in self.actors]
        if stopping:
            ray.wait(stopping, num_returns=len(stopping), timeout=grace_s)
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
