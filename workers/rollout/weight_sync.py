"""Moving new policy weights into a running vLLM engine without restarting it.

Two routes, one vLLM call at the end (``model_runner.reload_weights``):

- in-process engine (CPU, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the engine hands tensors straight to
  its only worker (``RolloutEngine.update_weights``);
- engine with worker processes (CUDA, tensor parallel): ``collective_rpc`` pickles its arguments, and
  tensors do not survive that (their storage is a memoryview), so the state dict travels as buckets of
  raw bytes to :class:`WeightSyncExtension`, which vLLM mixes into every worker (``worker_extension_cls``).
  Each worker stages the buckets and reloads once all have arrived.

Reloading must see the whole state dict in one call: vLLM rebuilds each layer from the weights it is
given, and a fused layer (qkv_proj, gate_up_proj) given only some of its parts would be left half empty.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

WORKER_EXTENSION_CLASS = "workers.rollout.weight_sync.WeightSyncExtension"
DEFAULT_BUCKET_BYTES = 256 * 1024**2


@dataclass(frozen=True)
class SerializedTensor:
    """A tensor as plain picklable data: its bytes plus what is needed to rebuild it."""

    name: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def from_tensor(cls, name: str, tensor: torch.Tensor) -> SerializedTensor:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        # Through uint8 because numpy has no bfloat16.
        data = flat.view(torch.uint8).numpy().tobytes()
        return cls(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), data)

    def to_tensor(self) -> torch.Tensor:
        raw = torch.frombuffer(bytearray(self.data), dtype=torch.uint8)
        return raw.view(getattr(torch, self.dtype)).reshape(self.shape)


def pack_weight_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[list[SerializedTensor]]:
    """Group serialized tensors into buckets of at most ``bucket_bytes`` (a larger tensor gets its own)."""
    buckets: list[list[SerializedTensor]] = []
    current: list[SerializedTensor] = []
    current_bytes = 0
    for name, tensor in named_tensors:
        serialized = SerializedTensor.from_tensor(name, tensor)
        if current and current_bytes + len(serialized.data) > bucket_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(serialized)
        current_bytes += len(serialized.data)
    if current:
        buckets.append(current)
    return buckets


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

    def receive_weight_bucket(self, bucket: list[SerializedTensor]) -> int:
        staged: list[tuple[str, torch.Tensor]] = self.__dict__.setdefault("_gmts_staged_weights", [])
        staged.extend((item.name, item.to_tensor()) for item in bucket)
        return len(staged)

    def apply_staged_weights(self) -> int:
        staged: list[tuple[str, torch.Tensor]] = self.__dict__.pop("_gmts_staged_weights", [])
        if not staged:
            raise RuntimeError("apply_staged_weights called with no staged weights")
        # Weight loaders copy (and shard) into the existing parameters, which moves host tensors to the device.
        self.model_runner.reload_weights(weights_iterator=staged)
        return len(staged)
