"""The learner's input: rollouts as padded token tensors, and how they are cut into pieces.

Layout. Row b holds prompt_b followed by response_b in ``input_ids`` [B, L], right-padded. Every
per-token tensor (``response_mask``, ``old_logp``, ``ref_logp``, and the learner's logp, entropy,
selection masks) is [B, T] with T = the longest response: column j is response token j, i.e. the
token *predicted* at input position ``prompt_lengths[b] − 1 + j`` and read at position
``prompt_lengths[b] + j``. That is the layout of vLLM's per-token logprobs, so sampling logprobs
drop in unchanged (``sampling_logp``).

``token_roles`` (optional, [B, T] long) says what each response token does in its answer — for the
selection diagnostics only, the loss never reads it: ``role_legend.names[i]`` is role i, ``NO_ROLE`` marks
padding and the rows of a task without roles. The task defines the roles (e.g. the worked-addition task's
``orchestrator/data/worked_addition.py``); the legend travels with the tensor so that the learner names them
without knowing the task.

A data container: how it is cut into shards, mini- and micro-batches is ``schedule.py``'s job, and
the model forward is ``forward.py``'s; :meth:`TrainBatch.select` and :meth:`TrainBatch.groups` are
the two primitives those cuts are made of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch


PER_TOKEN_LOGP = ("old_logp", "ref_logp", "sampling_logp")  # optional [B, T] log-prob fields
PER_TOKEN_OPTIONAL = (*PER_TOKEN_LOGP, "token_roles")  # every optional [B, T] field, cut like response_mask
NO_ROLE = -1  # token_roles off the mask, and on rows whose task has no roles


@dataclass(frozen=True)
class RoleLegend:
    """What the ids in ``TrainBatch.token_roles`` mean."""

    names: tuple[str, ...]  # names[i]: the name of role i (a metric key's last part)
    decisions: frozenset[int]  # the ids of the roles that are decisions (the rest is forced by the context)


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
    token_roles: torch.Tensor | None = None  # [B, T] long: role ids of role_legend, NO_ROLE off the mask
    role_legend: RoleLegend | None = None  # given exactly when token_roles is
    # [B] long: policy versions between the weights that sampled the row and the learner's before this step
    # (None: all 0, on-policy). A row with staleness > 0 takes π_old from sampling_logp (see engine.py).
    staleness: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rows, length = self.input_ids.shape
        expected = {"attention_mask": (rows, length), "prompt_lengths": (rows,), "advantages": (rows,),
                    "group_ids": (rows,), "response_mask": (rows, self.response_mask.shape[-1])}
        if self.staleness is not None:
            expected["staleness"] = (rows,)
        for name in PER_TOKEN_OPTIONAL:
            if getattr(self, name) is not None:
                expected[name] = tuple(self.response_mask.shape)
        for name, shape in expected.items():
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"TrainBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {shape}")
        if (self.token_roles is None) != (self.role_legend is None):
            raise ValueError("TrainBatch.token_roles and role_legend come together: got "
                             f"token_roles {'without' if self.role_legend is None else 'None with'} a legend")

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
        token_roles: Sequence[Sequence[int]] | None = None,
        role_legend: RoleLegend | None = None,
        staleness: Sequence[int] | None = None,
    ) -> TrainBatch:
        """Pad B (prompt, response) pairs; per-token lists (log-probs, role ids) have one entry per response
        token."""
        rows = len(prompt_ids)
        for name, values in (("response_ids", response_ids), ("advantages", advantages), ("group_ids", group_ids),
                             ("old_logp", old_logp), ("ref_logp", ref_logp), ("sampling_logp", sampling_logp),
                             ("token_roles", token_roles), ("staleness", staleness)):
            if values is not None and len(values) != rows:
                raise ValueError(f"{name} has {len(values)} entries for {rows} prompts")
        if rows == 0:
            raise ValueError("a TrainBatch needs at least one sequence")
        empty = [i for i, p in enumerate(prompt_ids) if len(p) == 0]
        if empty:
            raise ValueError(f"prompts {empty[:5]} are empty; each prompt needs ≥ 1 token (e.g. BOS)")
        length = max(len(p) + len(r) for p, r in zip(prompt_ids, response_ids))
        width = max(1, max(len(r) for r in response_ids))
        # One tensor per field from padded Python lists: one element-wise copy per row costs more than the
        # batch's own forward at tiny scale.
        input_ids = torch.tensor([[*prompt, *response] + [pad_id] * (length - len(prompt) - len(response))
                                  for prompt, response in zip(prompt_ids, response_ids)], dtype=torch.long)
        sequence_lengths = torch.tensor([len(p) + len(r) for p, r in zip(prompt_ids, response_ids)])
        response_lengths = torch.tensor([len(r) for r in response_ids])
        attention_mask = (torch.arange(length)[None] < sequence_lengths[:, None]).long()
        response_mask = (torch.arange(width)[None] < response_lengths[:, None]).float()
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
            token_roles=_pad_roles(token_roles, response_ids, width),
            role_legend=role_legend,
            staleness=None if staleness is None else torch.tensor(list(staleness), dtype=torch.long),
        )

    @classmethod
    def concat(cls, batches: Sequence[TrainBatch]) -> TrainBatch:
        """Rows of all ``batches`` in order (e.g. the shards of every rank), re-padded to the widest."""
        if not batches:
            raise ValueError("concat needs at least one TrainBatch")
        length = max(b.input_ids.shape[1] for b in batches)
        width = max(b.response_width for b in batches)

        legends = {b.role_legend for b in batches}
        if len(legends) > 1:
            raise ValueError(f"concat of batches with different role legends: {legends}")

        # The fill value of new padding never matters: nothing reads past a row's attention mask (roles
        # get NO_ROLE all the same, so that every padded place reads alike).
        def stack(name: str, columns: int, fill: int = 0):
            parts = [getattr(b, name) for b in batches]
            if any(p is None for p in parts):
                return None
            return torch.cat([torch.nn.functional.pad(p, (0, columns - p.shape[1]), value=fill) for p in parts])

        roles = stack("token_roles", width, NO_ROLE)

        return cls(
            input_ids=stack("input_ids", length),
            attention_mask=stack("attention_mask", length),
            prompt_lengths=torch.cat([b.prompt_lengths for b in batches]),
            response_mask=stack("response_mask", width),
            advantages=torch.cat([b.advantages for b in batches]),
            group_ids=torch.cat([b.group_ids for b in batches]),
            **{name: stack(name, width) for name in PER_TOKEN_LOGP},
            token_roles=roles,
            role_legend=None if roles is None else legends.pop(),
            staleness=_cat_staleness(batches),
        )

    def replace(self, **changes) -> TrainBatch:
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> TrainBatch:
        return dataclasses.replace(
            self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                     if isinstance(getattr(self, f.name), torch.Tensor)}
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
            **{name: per_token(getattr(self, name)) for name in PER_TOKEN_OPTIONAL},
            role_legend=self.role_legend,
            staleness=None if self.staleness is None else self.staleness[rows],
        )

    @property
    def is_stale(self) -> bool:
        """Some row was sampled by older weights than the learner's before this step."""
        return self.staleness is not None and bool((self.staleness > 0).any())


def _cat_staleness(batches: Sequence[TrainBatch]) -> torch.Tensor | None:
    """The rows' staleness in order; a batch without one is on-policy (0 on each row)."""
    if all(b.staleness is None for b in batches):
        return None
    return torch.cat([b.staleness if b.staleness is not None else torch.zeros(b.batch_size, dtype=torch.long)
                      for b in batches])


def _pad_per_token(values: Sequence[Sequence[float]] | None, responses: Sequence[Sequence[int]], width: int,
                   name: str) -> torch.Tensor | None:
    if values is None:
        return None
    for b, (row, response) in enumerate(zip(values, responses)):
        if len(row) != len(response):
            raise ValueError(f"{name}[{b}] has {len(row)} entries for a response of {len(response)} tokens")
    return torch.tensor([[*map(float, row)] + [0.0] * (width - len(row)) for row in values], dtype=torch.float32)


def _pad_roles(roles: Sequence[Sequence[int]] | None, responses: Sequence[Sequence[int]], width: int
               ) -> torch.Tensor | None:
    if roles is None:
        return None
    for b, (row, response) in enumerate(zip(roles, responses)):
        if len(row) not in (0, len(response)):
            raise ValueError(f"token_roles[{b}] has {len(row)} entries for a response of {len(response)} tokens "
                             "(an empty list: a row without roles)")
    return torch.tensor([[*row] + [NO_ROLE] * (width - len(row)) for row in roles], dtype=torch.long)
