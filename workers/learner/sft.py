"""Supervised warm-up: teach a from-scratch policy the answer format before RL.

GRPO learns only from groups whose rewards differ; a randomly initialised tiny model answers
nothing right, so every group has zero advantage. A short cross-entropy fit on (prompt, answer)
pairs gives it a base policy with reward variance (tiny Qwen2 on 2-digit addition reaches
15–50 % greedy accuracy in 75–115 s on one thread, measured when this was written). Plain PyTorch: one process, no engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from workers.learner.batch import TrainBatch
from workers.learner.forward import response_logits

logger = logging.getLogger(__name__)

Example = tuple[Sequence[int], Sequence[int]]  # (prompt ids, answer ids including EOS)
# One intra-op thread: the warm-up's bits must not depend on the machine's core count or the caller's setting
# (a tiny model gains little from more threads anyway).
WARMUP_THREADS = 1
# Written next to the weights: the checksum they had when trained (checked on every load).
CHECKSUM_FILE = "base_policy.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".safetensors.index.json", ".bin.index.json")


def answer_loss(model: torch.nn.Module, examples: Sequence[Example]) -> torch.Tensor:
    """Mean cross-entropy over the answer tokens only (prompt tokens are context, not targets)."""
    batch = TrainBatch.from_lists([p for p, _ in examples], [a for _, a in examples],
                                  advantages=[0.0] * len(examples), group_ids=range(len(examples)), pad_id=0)
    index = batch.response_index()
    logits = response_logits(model, batch.input_ids, batch.attention_mask, index.rows, index.positions)
    return F.cross_entropy(logits.float(), index.tokens)


def supervised_warmup(
    model_dir: str | Path,
    examples: Sequence[Example],
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    out_dir: str | Path,
) -> Path:
    """Fit ``steps`` AdamW steps of ``batch_size`` examples (reshuffled each pass) and save an HF folder.

    ``out_dir`` gets the trained weights (fp32) and config, their checksum (``CHECKSUM_FILE``), plus every
    other file of ``model_dir`` (tokenizer, generation config). The fit runs under ``deterministic_torch``:
    the same inputs give the same bits on any load and any caller thread setting. It is written under a temporary name and renamed into place,
    so a reader never sees half a folder; an existing ``out_dir`` is an error, not overwritten.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"supervised_warmup will not overwrite {out_dir}")
    if not examples or steps < 1 or batch_size < 1:
        raise ValueError(f"need examples, steps ≥ 1 and batch_size ≥ 1; got {len(examples)} examples, "
                         f"steps={steps}, batch_size={batch_size}")
    # Imported here: every run's driver imports this module, and transformers' model classes cost it seconds that
    # only a warm-up (once per base, cached after) needs.
    from transformers import AutoModelForCausalLM

    with deterministic_torch(threads=WARMUP_THREADS, seed=seed):
        model = _fit(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), examples,
                     steps=steps, lr=lr, batch_size=batch_size, seed=seed)
    return _save_folder(model, Path(model_dir), out_dir)


def _fit(model: torch.nn.Module, examples: Sequence[Example], *, steps: int, lr: float, batch_size: int,
         seed: int) -> torch.nn.Module:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    # Warm up for 5 % of the steps, then anneal: a short run lands on a reproducible base policy
    # instead of wherever a constant rate happens to be at the last step.
    warm = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))))
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    for step in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(len(examples), generator=generator).tolist()
        picked, order = order[:batch_size], order[batch_size:]
        loss = answer_loss(model, [examples[i] for i in picked])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == steps - 1:
            logger.info("warm-up step %d/%d: answer loss %.4f", step + 1, steps, loss.item())
    return model


@contextmanager
def deterministic_torch(threads: int, seed: int) -> Iterator[None]:
    """Run the body on ``threads`` intra-op threads with deterministic kernels and a seeded global RNG,
    then restore the caller's settings.

    A CPU matmul's reduction order depends on how many threads split it, so the same fit on 1 and on 2
    threads ends in different bits; on a base policy that sits anywhere near a learning transition those
    bits become points of accuracy. Pinning the count (and the kernels) makes the weights a function of
    the inputs alone, whatever the machine's load or the caller's ``torch.set_num_threads``.
    """
    previous_threads = torch.get_num_threads()
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    previous_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.use_deterministic_algorithms(previous_deterministic, warn_only=previous_warn_only)
        torch.set_num_threads(previous_threads)


def tensors_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every tensor, in sorted name order, with its name, dtype and shape: two folders with the
    same checksum hold the same weights bit for bit."""
    digest = hashlib.sha256()
    for name, tensor in sorted(tensors.items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def folder_checksum(folder: str | Path) -> str:
    """``tensors_checksum`` of the weights a saved HF folder holds (its ``*.safetensors`` files)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(file))
    return tensors_checksum(tensors)


def _save_folder(model: torch.nn.Module, source: Path, out_dir: Path) -> Path:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        for item in source.iterdir():  # tokenizer and the rest; weights and config come from save_pretrained
            if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES):
                shutil.copy2(item, staging / item.name)
        model.save_pretrained(staging, safe_serialization=True)
        (staging / CHECKSUM_FILE).write_text(json.dumps({"sha256": folder_checksum(staging)}) + "\n")
        os.rename(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
