"""The token-level method zoo's cores: which tokens a method treats, and how, as pure PyTorch functions.

Each function takes per-token tensors [B, T] of one population (a micro-batch, or a mini-batch
stacked) and a ``response_mask`` of the same shape. The selection registry
(:mod:`workers.learner.selection`) wraps each one as a method; the loss reads the per-token settings
they return (:class:`workers.learner.losses.TokenTerms`).

- **Clip-Cov** and **KL-Cov** ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language
  Models", arXiv 2505.22617, §4): the per-token covariance of log π and A,
  Cov_t = (A_t − mean A)(log π_t − mean log π), drives the entropy's change. Clip-Cov detaches the
  policy gradient of max(1, ⌊ρ·n⌋) tokens drawn at random among the unclipped tokens with
  lower < Cov_t < upper; KL-Cov adds c·|log π − log π_old| to the max(1, ⌊ρ·n⌋) tokens of largest
  Cov_t and drops the PPO clip (as verl's ``kl_cov``). n counts the population's response tokens.
- **Entropy advantage shaping** ("Reasoning with Exploration: An Entropy Perspective", arXiv 2506.14758,
  Eq. 4): A'_t = A_t + min(α·H_t, |A_t|/κ) with H detached; κ > 1 keeps the sign of A (a negative
  answer stays negative), and A = 0 stays 0, so entropy alone earns nothing.
- **Archer** ("Stabilizing Knowledge, Promoting Reasoning: Dual-Token Constraints for RLVR", arXiv
  2507.15778): the high-entropy tokens (reasoning) get a looser clip and a weaker KL, the others
  (knowledge) keep the loss's clip and KL; no token is masked. The authors rank each response on its own
  (``scope: response``, :func:`high_entropy_per_response`).

The covariance population: verl computes the means, n and the top-k/band inside its loss function,
i.e. over one micro-batch on one rank. Here the population is the selection ``scope``'s: ``micro_batch``
is verl's; ``mini_batch`` every token of the optimiser step on this rank; ``global_micro_batch`` and
``global`` the same on every data-parallel rank, exactly (means from summed moments, n summed, the
top-k and the random draw taken over the gathered covariances with one draw shared by every rank).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field, model_validator

from workers.learner.losses import PolicyLossConfig, TokenTerms

# ⌊ρ·n⌋ in floating point (0.29 · 100 = 28.999999999999996): round first, as selection.keep_count does.
_RATIO_DECIMALS = 9


class CovarianceConfig(BaseModel):
    """Clip-Cov's covariance band and ratio clip, KL-Cov's penalty (arXiv 2505.22617).

    Defaults are the authors' released scripts (PRIME-RL/Entropy-Mechanism-of-RL ``recipe/dapo/7b_clip_cov.sh``,
    ``7b_kl_cov.sh``; the same values in verl-recipe ``entropy/``); docs/methods.md lists each with its line.
    """

    model_config = ConfigDict(extra="forbid")

    clip_lower: float = Field(1.0, description="Clip-Cov: lower bound of the covariance band (clip_cov_lb = 1.0 "
                              "in the authors' 7b_clip_cov.sh).")
    clip_upper: float = Field(5.0, description="Clip-Cov: upper bound of the covariance band (clip_cov_ub = 5.0 "
                              "in the authors' 7b_clip_cov.sh).")
    ratio_clip: float | None = Field(
        1.0, ge=0.0, le=1.0, description="Clip-Cov: the PPO ratio clip ε (both sides) of a clip_cov run, in place of "
        "algorithm.loss.clip_low/clip_high: the authors' scripts run Clip-Cov with clip_ratio_low = clip_ratio_high "
        "= 1 (ratio clipped to [0, 2]), leaving the covariance detach to restrain the update; None = the loss's clip.")
    kl_coef: float = Field(1.0, gt=0.0, description="KL-Cov: coefficient c of |log π − log π_old| on the "
                           "top-covariance tokens (ppo_kl_coef = 1 in the authors' 7b/32b_kl_cov.sh; verl's own "
                           "config default is 0.1, its code's fallback 1.0).")

    @model_validator(mode="after")
    def _band_not_empty(self) -> CovarianceConfig:
        if self.clip_upper <= self.clip_lower:
            raise ValueError(f"clip_upper: the covariance band needs clip_upper > clip_lower, got "
                             f"clip_lower={self.clip_lower}, clip_upper={self.clip_upper}")
        return self


class EntropyAdvantageConfig(BaseModel):
    """A + min(α·H_detached, |A|/κ) (arXiv 2506.14758).

    α and κ are NOT verified: no released code and no text of the paper's experimental settings could be
    read with the tools this lab was built with; the values are kept as first read and labelled so in
    docs/methods.md.
    """

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(0.4, gt=0.0, description="α: entropy bonus per nat of token entropy (not verified against "
                         "the paper, docs/methods.md).")
    kappa: float = Field(2.0, gt=1.0, description="κ > 1: the bonus is capped at |A|/κ, so the shaped advantage "
                         "keeps A's sign (κ = 1 would zero a negative advantage); 2 is not verified against the "
                         "paper.")


class ArcherConfig(BaseModel):
    """Dual-token constraints (arXiv 2507.15778): the top ρ tokens by entropy get these settings.

    Defaults are the authors' released script (wizard-III/ArcherCodeR
    ``scripts/train/run_archer_qwen2.5_1.5b_code.sh``):
    token_entropy_quantile = 0.8 (ρ = 0.2, each response its own population: ``scope: response``),
    high_entropy_clip_ratio_low/high = 0.5, high_entropy_kl_loss_scale_coef = 0.0, and for the other tokens
    clip 0.2/0.2 and kl_loss_coef = 0.001 (low_var_kl), which are ``algorithm.loss``'s here.
    """

    model_config = ConfigDict(extra="forbid")

    high_entropy_clip: float = Field(
        0.5, ge=0.0, lt=1.0, description="ε (both sides) of the high-entropy tokens' ratio clip (Archer's "
        "high_entropy_clip_ratio_low/high = 0.5); the other tokens keep algorithm.loss.clip_low/clip_high.")
    high_entropy_kl_scale: float = Field(
        0.0, ge=0.0, description="The high-entropy tokens' KL coefficient as a multiple of algorithm.loss.kl_coef "
        "(the low-entropy tokens keep kl_coef itself): 0 = no KL on reasoning tokens (Archer's "
        "high_entropy_kl_loss_scale_coef = 0.0, an absolute coefficient there: the same at 0).")


# ------------------------------------------------------------------------------------------ populations
def _cross_rank(group: dist.ProcessGroup | None, cross_rank: bool) -> bool:
    return cross_rank and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def _population_mean(values: torch.Tensor, mask: torch.Tensor, group: dist.ProcessGroup | None,
                     cross_rank: bool) -> torch.Tensor:
    """Mean of ``values`` over the population's response tokens (every rank's with ``cross_rank``)."""
    weights = mask.to(values.dtype)
    if not _cross_rank(group, cross_rank):
        return (values * weights).sum() / weights.sum().clamp_min(1)
    moments = torch.stack([(values.double() * weights).sum(), weights.double().sum()])
    dist.all_reduce(moments, group=group)
    return (moments[0] / moments[1].clamp_min(1)).to(values.dtype)


def _gathered(values: torch.Tensor, group: dist.ProcessGroup | None, cross_rank: bool) -> tuple[torch.Tensor, int]:
    """Every rank's 1-D ``values`` concatenated in rank order, and this rank's offset in them."""
    if not _cross_rank(group, cross_rank):
        return values, 0
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    count = torch.tensor([values.numel()], dtype=torch.long, device=values.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    sizes = [int(c) for c in counts]
    padded = torch.zeros(max(sizes), dtype=values.dtype, device=values.device)
    padded[: values.numel()] = values
    pieces = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([p[:n] for p, n in zip(pieces, sizes)]), sum(sizes[:rank])


def _population_size(mask: torch.Tensor, group: dist.ProcessGroup | None, cross_rank: bool) -> int:
    n = torch.tensor([int(mask.sum())], dtype=torch.long, device=mask.device)
    if _cross_rank(group, cross_rank):
        dist.all_reduce(n, group=group)
    return int(n)


def treated_count(n: int, ratio: float) -> int:
    """max(1, ⌊ρ·n⌋): how many tokens Clip-Cov detaches and KL-Cov penalises (verl's ``max(int(ρ·n), 1)``)."""
    return max(1, int(round(n * ratio, _RATIO_DECIMALS)))


# ------------------------------------------------------------------------------------------ covariance
def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
                     process_group: dist.ProcessGroup | None = None, cross_rank: bool = False) -> torch.Tensor:
    """Cov_t = (A_t − mean A)(log π_t − mean log π), means over the population's response tokens; 0 off the mask."""
    mask = response_mask.bool()
    logp = logp.detach()
    centred_a = advantages - _population_mean(advantages, mask, process_group, cross_rank)
    centred_logp = logp - _population_mean(logp, mask, process_group, cross_rank)
    return torch.where(mask, centred_a * centred_logp, torch.zeros_like(logp))


def clip_cov_detached(*, covariance: torch.Tensor, clipped: torch.Tensor, response_mask: torch.Tensor, ratio: float,
                      lower: float, upper: float, generator: torch.Generator,
                      process_group: dist.ProcessGroup | None = None, cross_rank: bool = False) -> torch.Tensor:
    """Bool [B, T]: the tokens whose policy gradient Clip-Cov detaches.

    Candidates are the response tokens not already clipped by PPO with lower < Cov < upper, in row-major
    order (every rank's, in rank order, with ``cross_rank``); a random permutation drawn from ``generator``
    (the same draw on every rank when cross-rank) picks max(1, ⌊ρ·n⌋) of them.
    """
    mask = response_mask.bool()
    band = mask & ~clipped & (covariance > lower) & (covariance < upper)
    local = band.flatten().nonzero().squeeze(-1)
    n = _population_size(mask, process_group, cross_rank)
    candidates, offset = _gathered(local, process_group, cross_rank)
    detached = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    if candidates.numel():
        order = torch.randperm(candidates.numel(), generator=generator).to(mask.device)
        picked = order[: min(treated_count(n, ratio), candidates.numel())]
        mine = picked[(picked >= offset) & (picked < offset + local.numel())] - offset
        detached[local[mine]] = True
    return detached.view_as(mask)


def kl_cov_penalised(*, covariance: torch.Tensor, response_mask: torch.Tensor, ratio: float,
                     process_group: dist.ProcessGroup | None = None, cross_rank: bool = False) -> torch.Tensor:
    """Bool [B, T]: the max(1, ⌊ρ·n⌋) response tokens of largest covariance (over every rank with ``cross_rank``)."""
    mask = response_mask.bool()
    local = mask.flatten().nonzero().squeeze(-1)
    values, offset = _gathered(covariance.flatten()[local].float(), process_group, cross_rank)
    penalised = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    if values.numel():
        top = torch.topk(values, min(treated_count(values.numel(), ratio), values.numel()), largest=True).indices
        mine = top[(top >= offset) & (top < offset + local.numel())] - offset
        penalised[local[mine]] = True
    return penalised.view_as(mask)


# ----------------------------------------------------------------------------------------- entropy
def entropy_shaped_advantages(advantages: torch.Tensor, entropy: torch.Tensor, response_mask: torch.Tensor,
                              config: EntropyAdvantageConfig) -> torch.Tensor:
    """A + min(α·H_detached, |A|/κ) on the response tokens (arXiv 2506.14758, Eq. 4); 0 elsewhere."""
    bonus = torch.minimum(config.alpha * entropy.detach(), advantages.abs() / config.kappa)
    return torch.where(response_mask.bool(), advantages + bonus, torch.zeros_like(advantages))


def high_entropy_per_response(entropy: torch.Tensor, response_mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """Bool [B, T]: Archer's high-entropy tokens, each response its own population.

    As the authors' actor (ArcherCodeR ``verl/workers/actor/dp_actor.py``): a token is high-entropy when its
    H is strictly above the linear-interpolated ``token_entropy_quantile`` (= 1 − ρ) of its own response's
    H (``torch.nanquantile`` over the row); a token at the threshold is low-entropy.
    """
    mask = response_mask.bool()
    values = torch.where(mask, entropy.detach().float(), torch.full_like(entropy, float("nan"), dtype=torch.float32))
    threshold = torch.nanquantile(values, q=round(1.0 - ratio, _RATIO_DECIMALS), dim=-1, keepdim=True)
    return mask & (values > threshold)


def archer_terms(high_entropy: torch.Tensor, loss: PolicyLossConfig, config: ArcherConfig,
                 dtype: torch.dtype = torch.float32) -> TokenTerms:
    """Per-token clip range and KL weight: the high-entropy tokens' looser clip and weaker KL, the loss's elsewhere."""
    high = high_entropy.bool()
    loose = torch.full(high.shape, config.high_entropy_clip, dtype=dtype, device=high.device)
    return TokenTerms(
        clip_low=torch.where(high, loose, torch.full_like(loose, loss.clip_low)),
        clip_high=torch.where(high, loose, torch.full_like(loose, loss.clip_high)),
        kl_coef=torch.where(high, torch.full_like(loose, loss.kl_coef * config.high_entropy_kl_scale),
                            torch.full_like(loose, loss.kl_coef)),
    )
