"""A full state dict packed for Ray's object store, so that an engine reads it without copying it.

Ray pickles a torch tensor in band: the learner's ~650 MB of SmolLM2 weights were copied into the
object store, out of it into the driver, into the store again (``ray.put``) and out into the engine —
5.0 s of a 18 s iteration. A NumPy array instead travels out of band, and its reader maps it from
shared memory without a copy. So each tensor goes as a flat uint8 array (uint8: NumPy has no bfloat16)
plus its dtype and shape, and the learner's ObjectRef goes straight to the engines, never through the
driver (measured: `benchmarks/RESULTS.md`, vs_trl and weight_sync).

The tensors rebuilt on the reader's side are views of read-only shared memory: load them (vLLM's
``reload_weights`` copies into its own parameters), never write to them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch


def as_uint8(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(dtype name such as "bfloat16", shape, the bytes as a flat uint8 array) of a tensor; no copy for a
    contiguous CPU tensor. Through uint8 because NumPy has no bfloat16."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), flat.view(torch.uint8).numpy()


def from_uint8(dtype: str, shape: Sequence[int], data: np.ndarray) -> torch.Tensor:
    """The tensor :func:`as_uint8` took apart, as a view of ``data`` (no copy)."""
    with warnings.catch_warnings():
        # Arrays read from the object store are read-only and torch warns that it cannot enforce that;
        # callers only read them (the module docstring).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(data).view(getattr(torch, dtype)).reshape(tuple(shape))


class HostWeights:
    """``(name, tensor)`` pairs that Ray moves without pickling the tensors' bytes; iterate to get them back.

    Packing shares memory with CPU tensors that are already contiguous: pass copies (as
    ``LearnerEngine.state_dict_for_inference`` makes) if the originals will change before Ray stores them.
    """

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]]):
        self._entries = [(name, *as_uint8(tensor)) for name, tensor in named_tensors]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(data.nbytes for *_, data in self._entries)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, dtype, shape, data in self._entries:
            yield name, from_uint8(dtype, shape, data)
