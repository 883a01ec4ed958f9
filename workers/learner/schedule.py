"""The PPO update's schedule as pure functions: what one optimiser step spans, and how its loss is scaled.

A mini-batch (one optimiser step on this rank) is cut into micro-batches (one forward/backward
each); see ``batch.TrainBatch.split`` / ``pack_by_tokens``. This module holds what follows from
that cut without touching a model:

- :func:`loss_units` — what an aggregation averages over, so that micro-batch losses weighted by
  u_micro / U_mini add up to the one aggregate over the mini-batch;
- :func:`needs_scoring_pass` — whether the selection population spans more than the micro-batch
  being trained (``scope`` ``mini_batch`` / ``global`` with several micro-batches): then the
  learner scores the whole mini-batch in one no-grad pass before its first backward, since no
  exact threshold over the step exists before every one of its tokens has a score;
- :func:`needs_reference_pass` — whether π_old (and π_ref) need a no-grad pass of their own before
  the update: only when the update is more than one on-policy optimiser step, or KL needs π_ref;
- :func:`stack_rows` / :func:`row_spans` — the mini-batch's per-token tensors as one [ΣB, T_max]
  population and each micro-batch's rows in it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from workers.learner.config import LearnerConfig
from workers.learner.selection import MINI_BATCH_SCOPES, SelectionConfig


def loss_units(response_mask: torch.Tensor, loss_agg: str) -> float:
    """What a loss aggregation averages over: tokens (token-mean) or answered sequences (seq-mean-*)."""
    if loss_agg == "token-mean":
        return float(response_mask.sum())
    return float((response_mask.sum(-1) > 0).sum())


def needs_scoring_pass(selection: SelectionConfig, micro_batches: int) -> bool:
    """True when the selection of a micro-batch depends on tokens of other micro-batches of its step.

    A mini-batch that is one micro-batch never needs one: its training forward scores the whole
    population (on every rank for ``global``)."""
    return selection.method != "none" and selection.scope in MINI_BATCH_SCOPES and micro_batches > 1


def mini_batches_per_epoch(learner: LearnerConfig, rows: int) -> int:
    """Optimiser steps per epoch on a rank holding ``rows`` sequences (equal shards: the same on every rank)."""
    return max(1, math.ceil(rows / learner.mini_batch_per_rank))


def needs_reference_pass(learner: LearnerConfig, rows: int, kl_coef: float) -> bool:
    """With one epoch over one mini-batch π_old = π at the first forward, and the learner takes it from
    there (no extra pass); several optimiser steps move π away from π_old, and KL needs π_ref."""
    return kl_coef > 0 or learner.ppo_epochs * mini_batches_per_epoch(learner, rows) > 1


def stack_rows(parts: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """Per-row tensors [B_i] or per-token tensors [B_i, T_i] as one [ΣB_i(, T_max)] tensor, zero-padded."""
    if any(p is None for p in parts):
        return None
    if parts[0].dim() == 1:
        return torch.cat(list(parts))
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])


def row_spans(parts: Sequence[torch.Tensor]) -> list[tuple[int, int, int]]:
    """(first row, end row, width) of each part inside :func:`stack_rows` of the parts."""
    spans, start = [], 0
    for part in parts:
        spans.append((start, start + part.shape[0], part.shape[1]))
        start += part.shape[0]
    return spans
