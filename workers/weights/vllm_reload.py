"""Moving new policy weights into a running vLLM engine without restarting it.

Three routes (``RolloutConfig.weight_sync``), one vLLM call at the end (``model_runner.reload_weights``):

- in-process engine (CPU, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the engine hands tensors straight to
  its only worker (``RolloutEngine.update_weights``);
- engine with worker processes (CUDA, tensor parallel, or CPU with multiprocessing on): ``collective_rpc``
  serialises its arguments twice, and tensors do not survive the second hop (the engine core decodes them
  onto a memoryview, which cannot be pickled for the workers). So the state dict travels as buckets of raw
  bytes to :class:`WeightSyncExtension`, which vLLM mixes into every worker (``worker_extension_cls``);
  each worker stages the buckets and reloads once all have arrived;
- collective (CUDA by default): the learner rank 0 and every worker join a process group of their own
  (``join_weight_sync_group``), and the worker receives the buckets straight from the learner's broadcast
  (``receive_broadcast_weights``, protocol in ``workers/weights/broadcast.py``): no bytes through the engine
  core, no serialisation, NCCL between GPUs.

Reloading must see the whole state dict in one call: vLLM rebuilds each layer from the weights it is
given, and a fused layer (qkv_proj, gate_up_proj) given only some of its parts would be left half empty.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from workers.weights import broadcast as weight_broadcast
from workers.weights.object_store import as_uint8, from_uint8

logger = logging.getLogger(__name__)

WORKER_EXTENSION_CLASS = "workers.weights.vllm_reload.WeightSyncExtension"
DEFAULT_BUCKET_BYTES = weight_broadcast.DEFAULT_BUCKET_BYTES


# A tensor as builtin types only: (name, dtype name such as "bfloat16", shape, raw bytes). The request
# crosses msgpack (client → engine core) and pickle (engine core → workers); msgpack turns dataclasses
# into dicts and tuples into lists, so nothing richer survives both hops.
WireTensor = tuple[str, str, list[int], bytes]


def tensor_to_wire(name: str, tensor: torch.Tensor) -> WireTensor:
    dtype, shape, data = as_uint8(tensor)
    return name, dtype, list(shape), data.tobytes()


def tensor_from_wire(item: Sequence[Any]) -> tuple[str, torch.Tensor]:
    name, dtype, shape, data = item
    return name, from_uint8(dtype, shape, np.frombuffer(bytearray(data), dtype=np.uint8))  # writable copy


def pack_weight_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[list[WireTensor]]:
    """Group wire tensors into buckets of at most ``bucket_bytes`` (a larger tensor travels alone), planned
    like the collective route's buckets (:func:`workers.weights.broadcast.plan_buckets`)."""
    items = list(named_tensors)
    return [[tensor_to_wire(*items[index]) for index in bucket]
            for bucket in weight_broadcast.plan_buckets(weight_broadcast.tensor_specs(items), bucket_bytes)]


def send_weights_via_rpc(
    llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> None:
    """Reload weights in every worker of ``llm`` (a ``vllm.LLM`` built with ``worker_extension_cls``)."""
    for bucket in pack_weight_buckets(named_tensors, bucket_bytes):
        llm.collective_rpc("receive_weight_bucket", args=(bucket,))
    llm.collective_rpc("apply_staged_weights")


class WeightSyncExtension:
    """Mixed into each vLLM worker by ``worker_extension_cls``; called through ``llm.collective_rpc``.

    ``self`` is the vLLM worker, so ``self.model_runner`` is available; attribute names are prefixed
    to stay clear of the worker's own.
    """

    def receive_weight_bucket(self, bucket: list[Sequence[Any]]) -> int:
        staged: list[tuple[str, torch.Tensor]] = self.__dict__.setdefault("_gmts_staged_weights", [])
        staged.extend(tensor_from_wire(item) for item in bucket)
        return len(staged)

    def apply_staged_weights(self) -> int:
        staged: list[tuple[str, torch.Tensor]] = self.__dict__.pop("_gmts_staged_weights", [])
        if not staged:
            raise RuntimeError("apply_staged_weights called with no staged weights")
        # Weight loaders copy (and shard) into the existing parameters, which moves host tensors to the device.
        self.model_runner.reload_weights(weights_iterator=staged)
        return len(staged)

    # ------------------------------------------------------------------------- the collective route
    def weight_sync_device(self) -> str | None:
        """The GPU this worker computes on (None on CPU), so the driver can pick NCCL or gloo."""
        return weight_broadcast.local_device_key(self.device) if self.device.type == "cuda" else None

    def join_weight_sync_group(self, host: str, port: int, rank_offset: int, world_size: int, backend: str) -> int:
        """Join the learner's weight-sync group as rank ``rank_offset`` + this worker's rank in its engine."""
        rank = rank_offset + self.rank  # vLLM's own rank of this worker (its tensor-parallel rank)
        self._gmts_weight_group = weight_broadcast.join_group(host, port, rank, world_size, backend)
        return rank

    def receive_broadcast_weights(self) -> int:
        """Receive the learner's whole state dict, then reload once (buckets straight onto the device)."""
        group = self.__dict__.get("_gmts_weight_group")
        if group is None:
            raise RuntimeError("receive_broadcast_weights before join_weight_sync_group")
        received = weight_broadcast.receive_weights(group, device=self.device)
        self.model_runner.reload_weights(weights_iterator=received)
        return len(received)
