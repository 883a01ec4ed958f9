"""The driver's one call for the weight sync: the learners' new policy into every rollout engine, whatever the route.

Both ends live here, so that the driver never pairs calls itself. The engines resolve ``rollout.weight_sync``
(``RolloutEngine.weight_sync_route``; one config, one answer):

- ``in_process`` / ``bytes``: every learner rank takes part in gathering the full weights (ZeRO-3), rank 0 puts them
  in Ray's object store once as ``HostWeights``, and every engine maps that one copy (never through the driver);
- ``collective``: learner rank 0 and every vLLM worker join one process group when the sync is built (NCCL when
  each sits on a GPU of its own, else gloo: ``broadcast.choose_backend``), and each push is a broadcast. The two
  ends of a collective block until the other side calls, so their Ray calls are awaited together, in one
  ``ray.get``, or the first one waits forever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import ray
import torch
from ray.actor import ActorHandle

from workers.rendezvous import free_address
from workers.weights.broadcast import choose_backend
from workers.weights.object_store import HostWeights

logger = logging.getLogger(__name__)


class WeightSync:
    """Pushes learner rank 0's weights to ``engines`` (``RolloutEngine`` actors) on the route they resolved."""

    def __init__(self, learners: Sequence[ActorHandle], engines: Sequence[ActorHandle], bucket_bytes: int) -> None:
        """``learners``: the ``LearnerEngine`` ranks, rank 0 first. On the collective route this joins the
        weight-sync group at once (seconds; the learners and engines must be up)."""
        if not learners or not engines:
            raise ValueError("a weight sync needs at least one learner rank and one rollout engine")
        self.learners, self.engines, self.bucket_bytes = list(learners), list(engines), bucket_bytes
        self.route: str = ray.get(self.engines[0].weight_sync_route.remote())
        if self.route == "collective":
            self._connect()

    def push(self) -> float:
        """The learners' current weights into every engine; returns the seconds it took end to end."""
        started = time.perf_counter()
        if self.route == "collective":
            ray.get([learner.broadcast_weights.remote(self.bucket_bytes) for learner in self.learners]
                    + [engine.receive_weights.remote() for engine in self.engines])
        else:
            load_into_engines(self.engines, gather_weights(self.learners))
        return time.perf_counter() - started

    def _connect(self) -> None:
        """Learner rank 0 takes rank 0 (the store's master, at its rendezvous address); engine i's vLLM workers take
        1 + (workers of the engines before i) + their own rank."""
        host, port, _ = ray.get(self.learners[0].__ray_call__.remote(lambda engine: free_address()))
        per_engine = ray.get([engine.weight_sync_devices.remote() for engine in self.engines])
        devices = [ray.get(self.learners[0].weight_sync_device.remote())] + [d for ds in per_engine for d in ds]
        backend, world_size = choose_backend(devices), len(devices)
        offsets = [1 + sum(len(ds) for ds in per_engine[:i]) for i in range(len(per_engine))]
        ray.get([self.learners[0].join_weight_sync_group.remote(host, port, world_size, backend)]
                + [engine.join_weight_sync_group.remote(host, port, offset, world_size, backend)
                   for engine, offset in zip(self.engines, offsets, strict=True)])
        logger.info("weight sync: collective over %s, %d ranks at %s:%d", backend, world_size, host, port)


def gather_weights(learners: Sequence[ActorHandle]) -> ray.ObjectRef:
    """A reference to rank 0's full HF-named weights (``HostWeights``) in the object store. Every rank takes
    part (ZeRO-3 gathers); the other ranks' calls are awaited too, their errors included."""
    refs = [learner.weights_for_rollout.remote() for learner in learners]
    ray.get(refs[1:])
    return refs[0]


def load_into_engines(engines: Sequence[ActorHandle],
                      weights: Mapping[str, torch.Tensor] | ray.ObjectRef) -> list[float]:
    """The same weights into every engine; returns each engine's reload seconds. ``weights``: a state dict (put in
    the store once, as ``HostWeights``, that every engine maps) or a reference to ``HostWeights`` already there."""
    if not isinstance(weights, ray.ObjectRef):
        weights = ray.put(HostWeights(weights.items()))
    return ray.get([engine.update_weights.remote(weights) for engine in engines])
