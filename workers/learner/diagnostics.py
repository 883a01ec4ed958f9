"""Selection diagnostics the sweeps log: what was selected, and does entropy track G?

The GMTS paper motivates its score by the observation that within one answer, token entropy
ranks tokens almost as the exact logits-gradient norm G does; :func:`within_answer_spearman`
measures that on every batch.
"""

from __future__ import annotations

import torch

from workers.learner.losses import ClipMasks
from workers.learner.selection import Selection

SCORE_QUANTILES = (0.1, 0.5, 0.9)


def selection_diagnostics(
    selection: Selection,
    response_mask: torch.Tensor,
    entropy: torch.Tensor,
    grad_norm: torch.Tensor | None = None,
    clip: ClipMasks | None = None,
) -> dict[str, float]:
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
    return metrics


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = int(mask.sum())
    return float((values.float() * mask).sum() / count) if count else float("nan")


def within_answer_spearman(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, min_tokens: int = 3) -> float:
    """Mean over answers (rows with ≥ min_tokens tokens) of Spearman's ρ between x and y.

    Ranks are ordinal within each row's masked tokens (float ties are rare and do not bias the mean).
    """
    mask = mask.bool()
    counts = mask.sum(-1)
    rows = counts >= min_tokens
    if not bool(rows.any()):
        return float("nan")
    x, y, mask, counts = x[rows].double(), y[rows].double(), mask[rows], counts[rows].double()
    rank_x, rank_y = _row_ranks(x, mask), _row_ranks(y, mask)
    mean = (counts - 1) / 2  # mean of ranks 0..n−1
    dx, dy = (rank_x - mean[:, None]) * mask, (rank_y - mean[:, None]) * mask
    denominator = (dx.square().sum(-1) * dy.square().sum(-1)).sqrt()
    valid = denominator > 0
    if not bool(valid.any()):
        return float("nan")
    return float(((dx * dy).sum(-1)[valid] / denominator[valid]).mean())


def _row_ranks(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Masked-out entries sort last, so the masked-in entries get ranks 0..n−1.
    filled = torch.where(mask, values, torch.full_like(values, float("inf")))
    order = torch.argsort(filled, dim=-1, stable=True)
    ranks = torch.empty_like(values)
    ranks.scatter_(-1, order, torch.arange(values.shape[-1], dtype=values.dtype).expand_as(values).contiguous())
    return ranks
