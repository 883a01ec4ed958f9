"""The learner's input: rollouts as padded token tensors, and how they are cut into pieces.

Layout. Row b holds prompt_b followed by response_b in ``input_ids`` [B, L], right-padded. Every
per-token tensor (``response_mask``, ``old_logp``, ``ref_logp``, and the learner's logp, entropy,
selection masks) is [B, T] with T = the longest response: column j is response token j, i.e. the
token *predicted* at input position ``prompt_lengths[b] − 1 + j`` and read at position
``prompt_lengths[b] + j``. That is the layout of vLLM's per-token logprobs, so sampling logprobs
drop in unchanged (``sampling_logp``).

Pieces. Micro- and mini-batches are made of whole prompt groups (the n rollouts of one prompt), so
that ``scope='group'`` token selection sees each group at once; shards (one per learner rank) are
whole groups too. A group larger than a micro-batch is the one exception, see :meth:`TrainBatch.split`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch


PER_TOKEN_LOGP = ("old_logp", "ref_logp", "sampling_logp")  # optional [B, T] log-prob fields


@dataclass(frozen=True)
class ResponseIndex:
    """Where the response tokens are: N entries, one per response token of the batch."""

    rows: torch.Tensor  # [N] row b
    cols: torch.Tensor  # [N] column j in the [B, T] response layout
    positions: torch.Tensor  # [N] input position whose output predicts the token (P_b − 1 + j)
    tokens: torch.Tensor  # [N] the token ids themselves (input_ids[b, P_b + j])


@dataclass(frozen=True)
class TrainBatch:
    input_ids: torch.Tensor  # [B, L] long: prompt + response, right-padded
    attention_mask: torch.Tensor  # [B, L] long: 1 on prompt and response tokens
    prompt_lengths: torch.Tensor  # [B] long, ≥ 1 (the first response token needs a position to predict it)
    response_mask: torch.Tensor  # [B, T] float 0/1: column j is response token j
    advantages: torch.Tensor  # [B] float: one advantage per sequence
    group_ids: torch.Tensor  # [B] long: the prompt each row answers
    old_logp: torch.Tensor | None = None  # [B, T] log π_old (sampling policy), 0 off the mask
    ref_logp: torch.Tensor | None = None  # [B, T] log π_ref, 0 off the mask
    sampling_logp: torch.Tensor | None = None  # [B, T] the rollout engine's own logprobs, 0 off the mask

    def __post_init__(self) -> None:
        rows, length = self.input_ids.shape
        expected = {"attention_mask": (rows, length), "prompt_lengths": (rows,), "advantages": (rows,),
                    "group_ids": (rows,), "response_mask": (rows, self.response_mask.shape[-1])}
        for name in PER_TOKEN_LOGP:
            if getattr(self, name) is not None:
                expected[name] = tuple(self.response_mask.shape)
        for name, shape in expected.items():
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"TrainBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {shape}")

    # ------------------------------------------------------------------------------ construction
    @classmethod
    def from_lists(
        cls,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        advantages: Sequence[float] | torch.Tensor,
        group_ids: Sequence[int] | torch.Tensor,
        pad_id: int,
        old_logp: Sequence[Sequence[float]] | None = None,
        ref_logp: Sequence[Sequence[float]] | None = None,
        sampling_logp: Sequence[Sequence[float]] | None = None,
    ) -> TrainBatch:
        """Pad B (prompt, response) pairs; per-token log-prob lists have one entry per response token."""
        rows = len(prompt_ids)
        for name, values in (("response_ids", response_ids), ("advantages", advantages), ("group_ids", group_ids),
                             ("old_logp", old_logp), ("ref_logp", ref_logp), ("sampling_logp", sampling_logp)):
            if values is not None and len(values) != rows:
                raise ValueError(f"{name} has {len(values)} entries for {rows} prompts")
        if rows == 0:
            raise ValueError("a TrainBatch needs at least one sequence")
        empty = [i for i, p in enumerate(prompt_ids) if len(p) == 0]
        if empty:
            raise ValueError(f"prompts {empty[:5]} are empty; each prompt needs ≥ 1 token (e.g. BOS)")
        length = max(len(p) + len(r) for p, r in zip(prompt_ids, response_ids))
        width = max(1, max(len(r) for r in response_ids))
        input_ids = torch.full((rows, length), pad_id, dtype=torch.long)
        attention_mask = torch.zeros(rows, length, dtype=torch.long)
        response_mask = torch.zeros(rows, width)
        for b, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
            sequence = list(prompt) + list(response)
            input_ids[b, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            attention_mask[b, : len(sequence)] = 1
            response_mask[b, : len(response)] = 1.0
        return cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            prompt_lengths=torch.tensor([len(p) for p in prompt_ids], dtype=torch.long),
            response_mask=response_mask,
            advantages=torch.as_tensor(advantages, dtype=torch.float32).clone(),
            group_ids=torch.as_tensor(group_ids, dtype=torch.long).clone(),
            old_logp=_pad_per_token(old_logp, response_ids, width, "old_logp"),
            ref_logp=_pad_per_token(ref_logp, response_ids, width, "ref_logp"),
            sampling_logp=_pad_per_token(sampling_logp, response_ids, width, "sampling_logp"),
        )

    @classmethod
    def concat(cls, batches: Sequence[TrainBatch]) -> TrainBatch:
        """Rows of all ``batches`` in order (e.g. the shards of every rank), re-padded to the widest."""
        if not batches:
            raise ValueError("concat needs at least one TrainBatch")
        length = max(b.input_ids.shape[1] for b in batches)
        width = max(b.response_width for b in batches)

        # The fill value of new padding never matters: nothing reads past a row's attention mask.
        def stack(name: str, columns: int):
            parts = [getattr(b, name) for b in batches]
            if any(p is None for p in parts):
                return None
            return torch.cat([torch.nn.functional.pad(p, (0, columns - p.shape[1])) for p in parts])

        return cls(
            input_ids=stack("input_ids", length),
            attention_mask=stack("attention_mask", length),
            prompt_lengths=torch.cat([b.prompt_lengths for b in batches]),
            response_mask=stack("response_mask", width),
            advantages=torch.cat([b.advantages for b in batches]),
            group_ids=torch.cat([b.group_ids for b in batches]),
            **{name: stack(name, width) for name in PER_TOKEN_LOGP},
        )

    def replace(self, **changes) -> TrainBatch:
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> TrainBatch:
        return dataclasses.replace(
            self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                     if getattr(self, f.name) is not None}
        )

    # --------------------------------------------------------------------------------- properties
    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_width(self) -> int:
        return self.response_mask.shape[-1]

    def response_index(self) -> ResponseIndex:
        rows, cols = self.response_mask.bool().nonzero(as_tuple=True)
        positions = self.prompt_lengths[rows] - 1 + cols
        return ResponseIndex(rows=rows, cols=cols, positions=positions, tokens=self.input_ids[rows, positions + 1])

    def groups(self) -> list[torch.Tensor]:
        """Row indices of each group, groups in order of first appearance, rows ascending."""
        _, inverse = torch.unique(self.group_ids, return_inverse=True)
        row = torch.arange(self.batch_size, device=inverse.device)
        first_row = torch.full((int(inverse.max()) + 1,), self.batch_size, dtype=torch.long, device=inverse.device)
        first_row = first_row.scatter_reduce(0, inverse, row, reduce="amin")
        return [(inverse == g).nonzero().squeeze(-1) for g in torch.argsort(first_row).tolist()]

    # ------------------------------------------------------------------------------------ pieces
    def select(self, rows: torch.Tensor) -> TrainBatch:
        """The given rows, trimmed to their own longest sequence and longest response."""
        rows = rows.to(self.input_ids.device)
        length = int(self.attention_mask[rows].sum(-1).max())
        width = max(1, int(self.response_mask[rows].sum(-1).max()))
        per_token = lambda t: None if t is None else t[rows, :width]
        return TrainBatch(
            input_ids=self.input_ids[rows, :length],
            attention_mask=self.attention_mask[rows, :length],
            prompt_lengths=self.prompt_lengths[rows],
            response_mask=self.response_mask[rows, :width],
            advantages=self.advantages[rows],
            group_ids=self.group_ids[rows],
            **{name: per_token(getattr(self, name)) for name in PER_TOKEN_LOGP},
        )

    def split(self, size: int, generator: torch.Generator | None = None, split_large_groups: bool = True
              ) -> list[TrainBatch]:
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
        groups = self.groups()
        if generator is not None:
            groups = [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]
        pieces: list[list[torch.Tensor]] = []
        current: list[torch.Tensor] = []
        filled = 0
        for rows in groups:
            if len(rows) > size:
                if not split_large_groups:
                    raise ValueError(
                        f"group {int(self.group_ids[rows[0]])} has {len(rows)} sequences, more than a piece of "
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
        return [self.select(torch.cat(piece)) for piece in pieces]

    def pack_by_tokens(self, max_tokens: int, min_pieces: int = 1) -> list[TrainBatch]:
        """Pieces of whole groups whose padded size — rows × the piece's longest sequence, what a forward
        pass really holds — stays within ``max_tokens`` (dynamic batch size by token budget).

        Groups are taken longest first (by their longest sequence), so sequences of similar length share
        a piece and little is spent on padding; a piece is closed when the next group would take it over
        the budget. A group over the budget on its own is cut into consecutive row chunks that fit (one row
        at least), with the same caveat for ``scope='group'`` selection as in :meth:`split`. Then, while
        there are fewer than ``min_pieces`` pieces (every learner rank must run as many micro-batches as the
        busiest), the piece with the most padded tokens is halved: between its groups, else between rows.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be ≥ 1, got {max_tokens}")
        lengths = self.attention_mask.sum(-1)
        padded = lambda piece: sum(len(rows) for rows in piece) * max(int(lengths[rows].max()) for rows in piece)
        groups = sorted(self.groups(), key=lambda rows: -int(lengths[rows].max()))  # stable: ties keep order
        pieces: list[list[torch.Tensor]] = []
        for rows in groups:
            if pieces and padded(pieces[-1] + [rows]) <= max_tokens:
                pieces[-1].append(rows)
            elif padded([rows]) <= max_tokens:
                pieces.append([rows])
            else:
                fitting = max(1, max_tokens // int(lengths[rows].max()))
                pieces.extend([part] for part in rows.split(fitting))
        if len(pieces) < min_pieces and self.batch_size < min_pieces:
            raise ValueError(f"cannot cut {self.batch_size} sequences into {min_pieces} non-empty micro-batches")
        while len(pieces) < min_pieces:
            largest = max((p for p in pieces if sum(len(rows) for rows in p) > 1), key=padded)
            index = next(i for i, p in enumerate(pieces) if p is largest)
            pieces[index : index + 1] = _halve(largest)
        return [self.select(torch.cat(piece)) for piece in pieces]

    def shard(self, num_shards: int) -> list[TrainBatch]:
        """``num_shards`` equal-sized pieces of consecutive whole groups (one per learner rank).

        Ranks must run the same number of micro-batches (every forward under ZeRO-3 and every
        ``scope='global'`` selection is a collective), so shards must be the same size.
        """
        if self.batch_size % num_shards:
            raise ValueError(f"cannot shard {self.batch_size} sequences evenly over {num_shards} learner ranks")
        target = self.batch_size // num_shards
        shards: list[torch.Tensor] = []
        current: list[torch.Tensor] = []
        filled = 0
        for rows in self.groups():
            current.append(rows)
            filled += len(rows)
            if filled == target:
                shards.append(torch.cat(current))
                current, filled = [], 0
            elif filled > target:
                raise ValueError(
                    f"groups of sizes {[len(g) for g in self.groups()]} cannot be cut into {num_shards} shards "
                    f"of {target} sequences without splitting a group"
                )
        return [self.select(rows) for rows in shards]


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


def _pad_per_token(values: Sequence[Sequence[float]] | None, responses: Sequence[Sequence[int]], width: int,
                   name: str) -> torch.Tensor | None:
    if values is None:
        return None
    out = torch.zeros(len(responses), width)
    for b, (row, response) in enumerate(zip(values, responses)):
        if len(row) != len(response):
            raise ValueError(f"{name}[{b}] has {len(row)} entries for a response of {len(response)} tokens")
        out[b, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
    return out
