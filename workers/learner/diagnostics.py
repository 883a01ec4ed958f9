"""Selection diagnostics the sweeps log: what was selected, why two methods differ, and does entropy track G?

Per step (averaged over micro-batches), with w_t the token's weight in the policy-gradient term
(its aggregation weight over the tokens that term is normalised by, 0 if unselected):
- ``selection/zero_advantage_share``: share of the selected tokens with A = 0 (budget spent on tokens
  that cannot move the policy);
- ``selection/net_signed_weight``: Σ w·A / Σ w·|A| over the selected tokens, in [−1, 1]: 0 when the
  selection pushes up and down equally, +1 when it only reinforces;
- ``selection/mean_abs_advantage``: mean |A| of the selected tokens;
- ``selection/entropy_selected`` vs ``selection/entropy_all``;
- ``selection/decile_{0..9}``: the selected share of the tokens in each tenth of the answer
  (position j of an answer of n tokens is in decile ⌊10 j / n⌋).
- where the tokens go, when the batch carries token roles (``TrainBatch.token_roles``, e.g. the worked-addition
  task's operand copies, format, carries, column-sum digits, answer copies and its off-grammar ``x``; tokens of a
  task without roles are left out of all of these, and a share of nothing is NaN, left out of the step's mean):
  ``selection/role_share/<role>``, the share of the selected tokens that play that role;
  ``selection/role_rate/<role>``, the share of that role's tokens that are selected; ``selection/decision_share``,
  the share of the selected tokens that are decisions (``RoleLegend.decisions``), beside its base rate among all
  response tokens, ``selection/decision_base_share``; and ``selection/decision_share_decile_{0..9}``, the same
  share among the selected tokens of each tenth of the answer. A method that keeps every token measures the base
  rates (role_share = the roles' mix, role_rate = 1); the 80/20 paper's claim that high-entropy tokens are the
  "forking" decisions predicts decision_share well above decision_base_share for a top-ρ selection.
- for the methods that single tokens out rather than mask them (``Selection.treated``: Clip-Cov's detached,
  KL-Cov's penalised, Archer's high-entropy tokens), the same facts of the treated set:
  ``selection/treated_fraction``, ``selection/entropy_treated``, ``selection/treated_zero_advantage_share``,
  ``selection/treated_net_signed_weight``, ``selection/treated_mean_abs_advantage``.
- off-policy, per micro-batch (``omega_vs_advantage_ranking``, logged by the learner beside ``policy/ratio_abs_dev``):
  ``selection/gmts_vs_h_abs_a_spearman`` and ``selection/gmts_vs_h_abs_a_overlap``, how GMTS's H·|ω| ranks a group's
  tokens against H·|A| (what it reduces to on-policy without KL).
Advantages are those the loss used (a shaping method's, e.g. entropy_adv, replace the batch's), 1-D per
sequence or [B, T] per token.

The GMTS paper motivates its score by the observation that within one answer, token entropy
ranks tokens almost as the exact logits-gradient norm G does; :func:`within_answer_spearman`
measures that on every batch (``selection/spearman_entropy_gradnorm``), and
:func:`log_entropy_gradnorm_pearson` how straight the relation is on the paper's log–log axes
(``selection/pearson_log_entropy_log_gradnorm``). :func:`gmts_score_spearman` asks the question behind
the score itself: does H_t·|ω_t| rank the tokens of a group of rollouts as the true norm of the loss
gradient with respect to their logits, |ω_t|·G_t, does?
"""

from __future__ import annotations


import torch

from workers.learner.batch import RoleLegend
from workers.learner.losses import ClipMasks, aggregation_weights
from workers.learner.selection import Selection

SCORE_QUANTILES = (0.1, 0.5, 0.9)


def selection_diagnostics(
    selection: Selection,
    response_mask: torch.Tensor,
    entropy: torch.Tensor,
    grad_norm: torch.Tensor | None = None,
    clip: ClipMasks | None = None,
    advantages: torch.Tensor | None = None,
    loss_agg: str = "token-mean",
    apply_to: str = "advantage",
    token_roles: torch.Tensor | None = None,
    role_legend: RoleLegend | None = None,
) -> dict[str, float]:
    """``token_roles`` [B, T] long with its ``role_legend``: add where the selected tokens go (module docstring)."""
    mask = response_mask.bool()
    n_tokens = int(mask.sum())
    chosen = selection.mask & mask
    metrics: dict[str, float] = {
        "selection/selected_fraction": float(chosen.sum()) / max(n_tokens, 1),
        "selection/eligible_fraction": float(selection.eligible.sum()) / max(n_tokens, 1),
        "selection/entropy_all": _masked_mean(entropy, mask),
        "selection/entropy_selected": _masked_mean(entropy, chosen),
    }
    eligible_scores = selection.scores[selection.eligible].float()
    if eligible_scores.numel():
        quantiles = torch.quantile(eligible_scores, torch.tensor(SCORE_QUANTILES, device=eligible_scores.device))
        for q, value in zip(SCORE_QUANTILES, quantiles):
            metrics[f"selection/score_q{int(q * 100)}"] = float(value)
    if clip is not None:
        for name, clipped in (("high", clip.clipped_high), ("low", clip.clipped_low), ("dual", clip.dual_clipped)):
            metrics[f"loss/clip_fraction_{name}"] = float((clipped & mask).sum()) / max(n_tokens, 1)
    if grad_norm is not None:
        metrics["selection/spearman_entropy_gradnorm"] = within_answer_spearman(entropy, grad_norm, mask)
        metrics["selection/pearson_log_entropy_log_gradnorm"] = log_entropy_gradnorm_pearson(entropy, grad_norm, mask)
    if advantages is not None:
        metrics.update(advantage_diagnostics(chosen, mask, advantages, loss_agg, apply_to))
    if selection.treated is not None:
        treated = selection.treated & mask
        metrics["selection/treated_fraction"] = float(treated.sum()) / max(n_tokens, 1)
        metrics["selection/entropy_treated"] = _masked_mean(entropy, treated)
        if advantages is not None:
            # Weighted as every response token counts (the treated tokens keep their place in the denominators).
            facts = advantage_diagnostics(treated, mask, advantages, loss_agg, "advantage")
            metrics.update({key.replace("selection/", "selection/treated_"): value for key, value in facts.items()})
    metrics.update(position_deciles(chosen, mask))
    if token_roles is not None and role_legend is not None:
        metrics.update(role_diagnostics(chosen, mask, token_roles, role_legend))
    return metrics


def role_diagnostics(chosen: torch.Tensor, mask: torch.Tensor, token_roles: torch.Tensor, legend: RoleLegend
                     ) -> dict[str, float]:
    """Which roles the selected tokens play, over the response tokens that have a role (NaN for a share of
    nothing: no selected token, no token of the role, no selected token in a decile)."""
    labelled = mask.bool() & (token_roles >= 0)
    picked = chosen & labelled
    decision = torch.zeros_like(labelled)
    for role in legend.decisions:
        decision |= token_roles == role
    share = lambda part, whole: float((part & whole).sum()) / int(whole.sum()) if int(whole.sum()) else float("nan")
    metrics = {}
    for role, name in enumerate(legend.names):
        playing = labelled & (token_roles == role)
        metrics[f"selection/role_share/{name}"] = share(playing, picked)
        metrics[f"selection/role_rate/{name}"] = share(chosen, playing)
    metrics["selection/decision_share"] = share(decision, picked)
    metrics["selection/decision_base_share"] = share(decision, labelled)
    decile = _answer_deciles(mask)
    for d in range(10):
        metrics[f"selection/decision_share_decile_{d}"] = share(decision, picked & (decile == d))
    return metrics


def advantage_diagnostics(chosen: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, loss_agg: str,
                          apply_to: str) -> dict[str, float]:
    """Which advantages the selection spends its policy-gradient weight on (see the module docstring)."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(mask)
    advantages = advantages.double()
    n_chosen = int(chosen.sum())
    if n_chosen == 0:
        return {}
    normalised_over = chosen if apply_to == "loss" else mask
    weights = aggregation_weights(normalised_over.double(), loss_agg).double() * chosen
    signed, absolute = float((weights * advantages).sum()), float((weights * advantages.abs()).sum())
    return {
        "selection/zero_advantage_share": float((chosen & (advantages == 0)).sum()) / n_chosen,
        "selection/net_signed_weight": signed / absolute if absolute > 0 else float("nan"),
        "selection/mean_abs_advantage": float(advantages.abs()[chosen].mean()),
    }


def position_deciles(chosen: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Selected share of the tokens in each tenth of their answer (NaN for a decile without tokens)."""
    decile = _answer_deciles(mask)
    out = {}
    for d in range(10):
        at = mask & (decile == d)
        n = int(at.sum())
        out[f"selection/decile_{d}"] = float((chosen & at).sum()) / n if n else float("nan")
    return out


def _answer_deciles(mask: torch.Tensor) -> torch.Tensor:
    """[B, T]: the tenth of its answer each token is in, ⌊10 j / n⌋ for position j of an answer of n tokens."""
    lengths = mask.sum(-1, keepdim=True).clamp_min(1)
    column = torch.arange(mask.shape[1], device=mask.device)[None].expand_as(mask)
    return torch.div(10 * column, lengths, rounding_mode="floor").clamp_max(9)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = int(mask.sum())
    return float((values.float() * mask).sum() / count) if count else float("nan")


def within_answer_spearman(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, min_tokens: int = 3) -> float:
    """Mean over answers (rows with ≥ min_tokens tokens) of Spearman's ρ between x and y.

    Ranks are ordinal within each row's masked tokens (float ties are rare and do not bias the mean);
    ρ is then Pearson's r of the ranks.
    """
    mask = mask.bool()
    return within_answer_pearson(_row_ranks(x.double(), mask), _row_ranks(y.double(), mask), mask, min_tokens)


def within_answer_pearson(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, min_tokens: int = 3) -> float:
    """Mean over answers (rows with ≥ min_tokens masked tokens) of Pearson's r between x and y.

    Rows where x or y does not vary have no r and are left out of the mean; NaN when no row has one.
    """
    mask = mask.bool()
    counts = mask.sum(-1)
    rows = counts >= min_tokens
    if not bool(rows.any()):
        return float("nan")
    x, y, mask, counts = x[rows].double(), y[rows].double(), mask[rows], counts[rows].double()
    x, y = torch.where(mask, x, 0.0), torch.where(mask, y, 0.0)  # masked-out entries may hold inf/NaN
    dx = (x - (x.sum(-1) / counts)[:, None]) * mask
    dy = (y - (y.sum(-1) / counts)[:, None]) * mask
    denominator = (dx.square().sum(-1) * dy.square().sum(-1)).sqrt()
    valid = denominator > 0
    if not bool(valid.any()):
        return float("nan")
    return float(((dx * dy).sum(-1)[valid] / denominator[valid]).mean())


def log_entropy_gradnorm_pearson(entropy: torch.Tensor, grad_norm: torch.Tensor, mask: torch.Tensor,
                                 min_tokens: int = 3) -> float:
    """Within-answer Pearson's r of log H_t vs log G_t: the paper's log–log figure as one number.

    Tokens with H = 0 or G = 0 (a probability of exactly 1 in float) have no logarithm and are left out.
    """
    kept = mask.bool() & (entropy > 0) & (grad_norm > 0)
    tiny = torch.finfo(torch.float64).tiny  # only where kept is False: keeps log finite before masking
    return within_answer_pearson(entropy.double().clamp_min(tiny).log(), grad_norm.double().clamp_min(tiny).log(),
                                 kept, min_tokens)


def gmts_score_spearman(entropy: torch.Tensor, grad_norm: torch.Tensor, omega: torch.Tensor, mask: torch.Tensor,
                        group_ids: torch.Tensor, min_tokens: int = 3) -> float:
    """Mean over groups of rollouts of Spearman's ρ between the GMTS score H_t·|ω_t| and the true norm of
    the loss gradient with respect to token t's logits, |ω_t|·G_t (see ``losses.effective_grad_coef``).

    A group is the population the GMTS release ranks; its answers' tokens are pooled, so this measures the
    ordering across answers as well as within one. Tokens with ω_t = 0 are left out: GMTS never selects
    them (``drops_zero_scores``) and their tied zeros on both sides would count as agreement.
    """
    mask = mask.bool() & (omega != 0)
    score, true_norm = entropy.double() * omega.double().abs(), grad_norm.double() * omega.double().abs()
    pooled = _pool_groups((score, true_norm), mask, group_ids)
    if pooled is None:
        return float("nan")
    (x, y), members = pooled
    return within_answer_spearman(x, y, members, min_tokens)


def omega_vs_advantage_ranking(entropy: torch.Tensor, omega: torch.Tensor, advantages: torch.Tensor,
                               mask: torch.Tensor, group_ids: torch.Tensor, ratio: float, min_tokens: int = 3
                               ) -> dict[str, float]:
    """How far GMTS's score H_t·|ω_t| ranks a group's tokens apart from H_t·|A_t| (what it reduces to on-policy,
    where the importance ratio is 1 and nothing is clipped): ``selection/gmts_vs_h_abs_a_spearman``, the mean over
    groups of Spearman's ρ between the two scores; ``selection/gmts_vs_h_abs_a_overlap``, the share of the tokens
    each score puts in its group's top ⌈ρ·n⌉ that the other puts there too. Both are exactly 1 on-policy
    without KL; they fall as the batch's sampler lags behind the learner (off-policy ratios, clipped tokens)."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(entropy)
    scores = (entropy.double() * omega.double().abs(), entropy.double() * advantages.double().abs())
    pooled = _pool_groups(scores, mask.bool(), group_ids)
    if pooled is None:
        return {}
    (gmts, plain), members = pooled
    keep = torch.ceil(ratio * members.sum(-1).double()).clamp_min(1)  # ⌈ρ·n⌉ per group, as Python computes it
    together = int((_row_top(gmts, members, keep) & _row_top(plain, members, keep)).sum())
    # Average ranks: the clipped tokens (ω = 0) tie, and an ordinal order among ties would be arbitrary.
    spearman = within_answer_pearson(_tied_row_ranks(gmts, members), _tied_row_ranks(plain, members), members,
                                     min_tokens)
    return {"selection/gmts_vs_h_abs_a_spearman": spearman,
            "selection/gmts_vs_h_abs_a_overlap": together / float(keep.sum())}


def _row_top(values: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """[G, n] bool: each row's ``keep`` largest masked entries. The sort is stable, so equal values fall by
    position, the same way for any two scores: equal scores keep equal sets."""
    return (_row_ranks(-values, mask) < keep[:, None]) & mask


def _tied_row_ranks(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's masked entries ranked 0..n−1 with ties given their mean rank (scipy's rankdata 'average');
    0 where masked out. All rows at once: it runs on every micro-batch."""
    filled = torch.where(mask, values.double(), torch.full_like(values, float("inf"), dtype=torch.float64))
    ordered, order = torch.sort(filled, dim=-1, stable=True)  # masked-out entries last
    width = values.shape[-1]
    place = torch.arange(width).expand_as(ordered)
    starts = torch.ones_like(mask)  # where a run of equal values begins, and where one ends
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    ends = torch.ones_like(mask)
    ends[:, :-1] = starts[:, 1:]
    first = torch.where(starts, place, 0).cummax(-1).values
    last = torch.where(ends, place, width).flip(-1).cummin(-1).values.flip(-1)
    ranks = torch.zeros_like(filled).scatter_(-1, order, (first + last).double() / 2)
    return torch.where(mask, ranks, 0.0)


def _pool_groups(values: tuple[torch.Tensor, ...], mask: torch.Tensor, group_ids: torch.Tensor
                 ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor] | None:
    """[B, T] values as [G, n_max] rows, one per group of rollouts (its answers' masked tokens side by side,
    row order), with the mask of the filled places; None when no token is masked in."""
    rows, columns = mask.nonzero(as_tuple=True)  # row-major: each answer's tokens in order, answers in order
    if rows.numel() == 0:
        return None
    distinct, group_of_row = torch.unique(group_ids, return_inverse=True)
    groups = group_of_row[rows]
    order = torch.sort(groups, stable=True).indices  # by group, row-major within one
    groups, rows, columns = groups[order], rows[order], columns[order]
    counts = torch.bincount(groups, minlength=len(distinct))  # a group without masked tokens keeps its empty row
    place = torch.arange(groups.numel()) - (torch.cumsum(counts, 0) - counts)[groups]
    shape = (counts.numel(), int(counts.max()))
    filled = torch.zeros(shape, dtype=torch.bool)
    filled[groups, place] = True
    pooled = tuple(torch.zeros(shape, dtype=torch.float64).index_put_((groups, place), value[rows, columns].double())
                   for value in values)
    return pooled, filled


def _row_ranks(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Masked-out entries sort last, so the masked-in entries get ranks 0..n−1.
    filled = torch.where(mask, values, torch.full_like(values, float("inf")))
    order = torch.argsort(filled, dim=-1, stable=True)
    ranks = torch.empty_like(values)
    ranks.scatter_(-1, order, torch.arange(values.shape[-1], dtype=values.dtype).expand_as(values).contiguous())
    return ranks
