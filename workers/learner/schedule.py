"""The PPO update's schedule as pure functions: what one optimiser step spans, and how its loss is scaled.

A step's batch is cut into one shard per learner rank (:func:`shard`), each shard into mini-batches
(one optimiser step on that rank, :func:`split_groups`), and each mini-batch into micro-batches (one
forward/backward each: :func:`split_groups` by rows, or :func:`pack_by_tokens` by a token budget).
Every piece is made of whole prompt groups (the n rollouts of one prompt), so that ``scope='group'``
token selection sees each group at once; a group larger than a micro-batch is the one exception.
This module holds those cuts and what follows from them, without touching a model:

- :func:`loss_units` — what an aggregation averages over, so that micro-batch losses weighted by
  u_micro / U_mini add up to the one aggregate over the mini-batch;
- :func:`loss_scale` / :func:`schedule_units` — that weight per micro-batch, and the per-mini-batch
  totals and shape the ranks exchange;
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

from workers.learner.batch import TrainBatch
from workers.learner.config import LearnerConfig
from workers.learner.selection import MINI_BATCH_SCOPES, SELECTION_METHODS, SelectionConfig


def loss_units(response_mask: torch.Tensor, loss_agg: str) -> float:
    """What a loss aggregation averages over: tokens (token-mean) or answered sequences (seq-mean-*)."""
    if loss_agg == "token-mean":
        return float(response_mask.sum())
    return float((response_mask.sum(-1) > 0).sum())


def loss_scale(micro_response_mask: torch.Tensor, loss_agg: str, mini_batch_units: float) -> float:
    """u_micro / U_mini: a micro-batch's weight in its mini-batch's one aggregate (U summed over ranks)."""
    return loss_units(micro_response_mask, loss_agg) / mini_batch_units


def schedule_units(schedule: Sequence[Sequence[TrainBatch]], loss_agg: str) -> tuple[list[int], list[float]]:
    """Micro-batches per mini-batch and each mini-batch's loss units on this rank (what the ranks compare
    and sum: every rank must run the same shape, and U is the sum over ranks)."""
    shape = [len(micros) for micros in schedule]
    units = [sum(loss_units(micro.response_mask, loss_agg) for micro in micros) for micros in schedule]
    return shape, units


def needs_scoring_pass(selection: SelectionConfig, micro_batches: int) -> bool:
    """True when the selection of a micro-batch depends on tokens of other micro-batches of its step.

    A mini-batch that is one micro-batch never needs one: its training forward scores the whole
    population (on every rank for ``global``)."""
    keeps_all = SELECTION_METHODS[selection.method].keeps_every_token
    return not keeps_all and selection.scope in MINI_BATCH_SCOPES and micro_batches > 1


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


def split_groups(batch: TrainBatch, size: int, generator: torch.Generator | None = None,
                 split_large_groups: bool = True) -> list[TrainBatch]:
    """Pieces of at most ``size`` sequences, each made of whole groups.

    Groups are packed in order (shuffled first when a ``generator`` is given) and a piece is
    closed when the next group does not fit, so with equal groups whose size divides ``size``
    every piece holds exactly ``size`` rows.

    A group larger than ``size`` is the exception: with ``split_large_groups`` it is cut into
    consecutive pieces of ``size`` rows (a piece never mixes it with another group), and a
    ``scope='group'`` selection then ranks each piece on its own — the population becomes "the
    part of the group in this micro-batch". Without it, such a group raises ``ValueError``
    (mini-batches must hold whole groups).
    """
    if size < 1:
        raise ValueError(f"split size must be ≥ 1, got {size}")
    groups = batch.groups()
    if generator is not None:
        groups = [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]
    pieces: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    filled = 0
    for rows in groups:
        if len(rows) > size:
            if not split_large_groups:
                raise ValueError(
                    f"group {int(batch.group_ids[rows[0]])} has {len(rows)} sequences, more than a piece of "
                    f"{size}; a mini-batch must hold whole groups (raise mini_batch_size)"
                )
            if current:
                pieces.append(current)
                current, filled = [], 0
            pieces.extend([[part] for part in rows.split(size)])
            continue
        if filled + len(rows) > size:
            pieces.append(current)
            current, filled = [], 0
        current.append(rows)
        filled += len(rows)
    if current:
        pieces.append(current)
    return [batch.select(torch.cat(piece)) for piece in pieces]

def pack_by_tokens(batch: TrainBatch, max_tokens: int, min_pieces: int = 1) -> list[TrainBatch]:
    """Pieces of whole groups whose padded size — rows × the piece's longest sequence, what a forward
    pass really holds — stays within ``max_tokens`` (dynamic batch size by token budget).

    Groups are taken longest first (by their longest sequence), so sequences of similar length share
    a piece and little is spent on padding; a piece is closed when the next group would take it over
    the budget. A group over the budget on its own is cut into consecutive row chunks that fit (one row
    at least), with the same caveat for ``scope='group'`` selection as in :func:`split_groups`. Then, while
    there are fewer than ``min_pieces`` pieces (every learner rank must run as many micro-batches as the
    busiest), the piece with the most padded tokens is halved: between its groups, else between rows.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be ≥ 1, got {max_tokens}")
    lengths = batch.attention_mask.sum(-1)
    padded = lambda piece: sum(len(rows) for rows in piece) * max(int(lengths[rows].max()) for rows in piece)
    groups = sorted(batch.groups(), key=lambda rows: -int(lengths[rows].max()))  # stable: ties keep order
    pieces: list[list[torch.Tensor]] = []
    for rows in groups:
        if pieces and padded(pieces[-1] + [rows]) <= max_tokens:
            pieces[-1].append(rows)
        elif padded([rows]) <= max_tokens:
            pieces.append([rows])
        else:
            fitting = max(1, max_tokens // int(lengths[rows].max()))
            pieces.extend([part] for part in rows.split(fitting))
    if len(pieces) < min_pieces and batch.batch_size < min_pieces:
        raise ValueError(f"cannot cut {batch.batch_size} sequences into {min_pieces} non-empty micro-batches")
    while len(pieces) < min_pieces:
        largest = max((p for p in pieces if sum(len(rows) for rows in p) > 1), key=padded)
        index = next(i for i, p in enumerate(pieces) if p is largest)
        pieces[index : index + 1] = _halve(largest)
    return [batch.select(torch.cat(piece)) for piece in pieces]

def shard(batch: TrainBatch, num_shards: int) -> list[TrainBatch]:
    """``num_shards`` equal-sized pieces of consecutive whole groups (one per learner rank).

    Ranks must run the same number of micro-batches (every forward under ZeRO-3 and every
    ``scope='global'`` selection is a collective), so shards must be the same size.
    """
    if batch.batch_size % num_shards:
        raise ValueError(f"cannot shard {batch.batch_size} sequences evenly over {num_shards} learner ranks")
    target = batch.batch_size // num_shards
    shards: list[torch.Tensor] = []
    current: list[torch.Tensor] = []
    filled = 0
    for rows in batch.groups():
        current.append(rows)
        filled += len(rows)
        if filled == target:
            shards.append(torch.cat(current))
            current, filled = [], 0
        elif filled > target:
            raise ValueError(
                f"groups of sizes {[len(g) for g in batch.groups()]} cannot be cut into {num_shards} shards "
                f"of {target} sequences without splitting a group"
            )
    return [batch.select(rows) for rows in shards]


def _halve(piece: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Two pieces of about half the rows each: cut between groups when there are several, else in the group."""
    if len(piece) == 1:
        rows = piece[0]
        return [[rows[: len(rows) // 2]], [rows[len(rows) // 2 :]]]
    total, filled = sum(len(rows) for rows in piece), 0
    for cut, rows in enumerate(piece[:-1], start=1):
        filled += len(rows)
        if 2 * filled >= total:
            break
    return [piece[:cut], piece[cut:]]
