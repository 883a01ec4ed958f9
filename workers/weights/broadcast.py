"""Broadcasting policy weights from learner rank 0 to the vLLM workers through a process group of their own.

The learners already have a torch.distributed world (DeepSpeed's), and so does every vLLM engine (its
tensor-parallel workers); a process can have only one default group. So the learner rank 0 and every vLLM
worker build an *extra* group straight from a ``TCPStore`` at an address the learner publishes, without
touching either default group (the idea of vLLM's ``stateless_init_torch_distributed_process_group`` and
of OpenRLHF's ``init_process_group``): rank 0 = learner rank 0, ranks 1.. = the vLLM workers.

The protocol (rank 0 sends, every other rank receives, all call in the same order):

1. a header: the length of a JSON document, then the document — ``{"bucket_bytes": …, "tensors":
   [[name, dtype, shape], …], "aliases": [[name, same-as-name], …]}`` (JSON, not pickle: nothing from
   the network is executed);
2. :func:`plan_buckets` cuts the tensor list into buckets of one dtype and at most ``bucket_bytes``
   (a larger tensor travels alone); both sides compute the same plan from the header;
3. one broadcast per bucket of a flat buffer; receivers split it into views with the header's shapes.

The receiver returns the whole state dict at once: vLLM's ``reload_weights`` must see it in one call
(see ``workers/weights/vllm_reload.py``), so a worker holds one extra copy of the weights while it syncs.

Backends: NCCL when every rank sits on a CUDA device of its own; gloo otherwise — on CPU, and when
two ranks share a GPU (learner and engine colocated), which NCCL refuses ("Duplicate GPU detected").
With gloo, buffers live in host memory and are copied to and from the device around the broadcast.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workers.rendezvous import listening_store, pin_gloo_to

logger = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 256 * 1024**2
STORE_PREFIX = "gmts-weight-sync"

# (name, dtype name such as "bfloat16", shape): what the header says about each tensor.
TensorSpec = tuple[str, str, list[int]]


@dataclass
class WeightBroadcastGroup:
    """One rank's membership of the weight-sync group; ``device`` is where its buffers live."""

    backend: object  # a ProcessGroupGloo / ProcessGroupNCCL backend, used directly (no global registry)
    store: dist.TCPStore  # kept alive: the master rank's store serves the others
    rank: int
    world_size: int
    device: torch.device

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.backend.broadcast(tensor, 0).wait()


def join_group(host: str, port: int, rank: int, world_size: int, backend: str,
               timeout_s: float = 600.0) -> WeightBroadcastGroup:
    """Join (rank 0: create) the group; blocks until all ``world_size`` ranks have joined."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"weight-sync backend {backend!r}; allowed: 'gloo', 'nccl'")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside the weight-sync group of {world_size}")
    timeout = timedelta(seconds=timeout_s)
    store = listening_store(host, port, world_size, rank == 0, timeout)
    pin_gloo_to(host)
    prefixed = dist.PrefixStore(STORE_PREFIX, store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        device = torch.device("cpu")
    logger.info("joined the weight-sync group at %s:%d as rank %d/%d (%s)", host, port, rank, world_size, backend)
    return WeightBroadcastGroup(group, store, rank, world_size, device)


def choose_backend(device_keys: Sequence[str | None]) -> str:
    """``nccl`` when every rank is on a CUDA device of its own, else ``gloo``.

    ``device_keys`` holds one entry per rank: :func:`local_device_key` (None for a CPU rank).
    """
    on_gpus = all(key is not None for key in device_keys)
    return "nccl" if on_gpus and len(set(device_keys)) == len(device_keys) else "gloo"


def local_device_key(device: torch.device | None = None) -> str | None:
    """Which physical GPU this process computes on (host + device UUID), or None on CPU."""
    if not torch.cuda.is_available():
        return None
    import socket

    properties = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    return f"{socket.gethostname()}:{properties.uuid}"


def tensor_specs(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    return [(name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)) for name, tensor in named_tensors]


def plan_buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``specs`` per bucket, in order: one dtype per bucket, at most ``bucket_bytes`` each
    unless a single tensor is larger (it then travels alone)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be ≥ 1, got {bucket_bytes}")
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes, current_dtype = 0, None
    for index, (_, dtype, shape) in enumerate(specs):
        size = _numel(shape) * _element_size(dtype)
        if current and (dtype != current_dtype or current_bytes + size > bucket_bytes):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(index)
        current_bytes += size
        current_dtype = dtype
    if current:
        buckets.append(current)
    return buckets


def send_weights(group: WeightBroadcastGroup, named_tensors: Sequence[tuple[str, torch.Tensor]],
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """Rank 0: broadcast the header, then each bucket; returns the bytes sent per receiver.

    A tensor that is another name for an earlier one (tied embeddings: ``lm_head.weight`` is
    ``model.embed_tokens.weight``) travels once; the header names it as an alias and receivers hand it
    back under both names — vLLM's ``reload_weights`` needs both (without ``lm_head.weight`` it keeps
    the old output layer).
    """
    if group.rank != 0:
        raise RuntimeError(f"send_weights runs on rank 0 of the weight-sync group, not rank {group.rank}")
    first_name: dict[tuple, str] = {}
    unique: list[tuple[str, torch.Tensor]] = []
    aliases: list[tuple[str, str]] = []  # (alias, the name it repeats), in state-dict order
    for name, tensor in named_tensors:
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.numel() and key in first_name:
            aliases.append((name, first_name[key]))
        else:
            first_name.setdefault(key, name)
            unique.append((name, tensor))
    named_tensors = unique
    specs = tensor_specs(named_tensors)
    _broadcast_header(group, {"bucket_bytes": bucket_bytes, "tensors": specs, "aliases": aliases})
    sent = 0
    for bucket in plan_buckets(specs, bucket_bytes):
        flat = torch.cat([named_tensors[i][1].detach().reshape(-1) for i in bucket]).to(group.device)
        group.broadcast(flat)
        sent += flat.numel() * flat.element_size()
    return sent


def receive_weights(group: WeightBroadcastGroup, device: torch.device | str | None = None
                    ) -> list[tuple[str, torch.Tensor]]:
    """Ranks ≥ 1: the whole state dict rank 0 sends, as (name, tensor) on ``device`` (default: the group's)."""
    if group.rank == 0:
        raise RuntimeError("receive_weights runs on the receiving ranks (≥ 1) of the weight-sync group")
    header = _broadcast_header(group, None)
    specs = [(name, dtype, list(shape)) for name, dtype, shape in header["tensors"]]
    target = torch.device(device) if device is not None else group.device
    received: list[tuple[str, torch.Tensor]] = []
    for bucket in plan_buckets(specs, header["bucket_bytes"]):
        dtype = _dtype(specs[bucket[0]][1])
        flat = torch.empty(sum(_numel(specs[i][2]) for i in bucket), dtype=dtype, device=group.device)
        group.broadcast(flat)
        flat = flat.to(target)
        offset = 0
        for i in bucket:
            name, _, shape = specs[i]
            count = _numel(shape)
            received.append((name, flat[offset : offset + count].view(shape)))
            offset += count
    by_name = dict(received)
    received.extend((alias, by_name[source]) for alias, source in header["aliases"])
    return received


def _broadcast_header(group: WeightBroadcastGroup, header: dict | None) -> dict:
    """Rank 0 passes the header; the others get it. A length first, so receivers can size the buffer."""
    payload = json.dumps(header).encode() if group.rank == 0 else b""
    length = torch.tensor([len(payload)], dtype=torch.int64, device=group.device)
    group.broadcast(length)
    if group.rank == 0:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(group.device)
    else:
        data = torch.empty(int(length.item()), dtype=torch.uint8, device=group.device)
    group.broadcast(data)
    return header if group.rank == 0 else json.loads(data.cpu().numpy().tobytes())


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in a weight-sync header")
    return dtype


def _element_size(dtype: str) -> int:
    return torch.empty(0, dtype=_dtype(dtype)).element_size()
