"""RLVR policy losses as pure functions: PPO-clip surrogate, KL estimators, loss aggregation.

Everything here takes per-token tensors of shape [B, T] (B sequences, T response positions) and a
``response_mask`` of the same shape, and knows nothing of models, engines or processes.

Conventions (as in verl's ``core_algos``, except where noted):
- ratio r_t = exp(log π − log π_old); the PPO-clip surrogate per token is
  ℓ_t = max(−A r, −A clip(r, 1 − ε_low, 1 + ε_high)), and with dual-clip c (A < 0 only)
  ℓ_t = min(ℓ_t, −A c).
- the KL penalty β·KL_t(π ‖ π_ref) is added per token, with KL estimated by k1, k2 or k3.
- per-token losses are reduced to a scalar by an aggregation mode; every mode is a weighted sum
  Σ w_t ℓ_t, and :func:`aggregation_weights` returns those w_t (GMTS needs them: they scale each
  token's gradient). ``seq-mean-token-sum-norm`` is *not* verl's: verl divides the token sum of the
  batch by T alone; this one divides by T · n_seq, as TRL's ``loss_type='dr_grpo'`` and the Dr. GRPO
  paper do (a mean over sequences of token sums over a constant length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

from workers.registry import Registered


KL_ESTIMATORS: dict[str, KLTerm] = {}  # filled by register_kl_estimator below (KLTerm: see there)
# An aggregation maps (response mask [B, T], constant length) to each token's weight in the loss.
AGGREGATIONS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {}

# low_var_kl is k3 clamped to this range, as in verl; beyond it the gradient is zero.
LOW_VAR_KL_BOUND = 10.0


class PolicyLossConfig(BaseModel):
    """The loss actually optimised; token selection (GMTS) reads it to compute ω."""

    model_config = ConfigDict(extra="forbid")

    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="ε_low: ratio lower clip is 1 − ε_low.")
    clip_high: float = Field(0.2, ge=0.0, description="ε_high: ratio upper clip is 1 + ε_high (DAPO: 0.28).")
    dual_clip: float | None = Field(
        None, gt=1.0, description="Dual-clip constant c (> 1) bounding the loss of A < 0 tokens; None = off."
    )
    kl_coef: float = Field(0.0, ge=0.0, description="β of the per-token KL(π‖π_ref) penalty; 0 = no KL.")
    kl_estimator: Registered(KL_ESTIMATORS, "kl_estimator") = Field(  # type: ignore[valid-type]
        "k3", description="A registered KL estimator (register_kl_estimator): k1, k2, k3, low_var_kl.")
    loss_agg: Registered(AGGREGATIONS, "loss_agg") = Field(  # type: ignore[valid-type]
        "token-mean", description="A registered loss aggregation (register_aggregation): token-mean, "
        "seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm.")
    loss_agg_norm_length: int | None = Field(
        None, gt=0, description="Constant length for seq-mean-token-sum-norm (Dr. GRPO); None = T of the batch."
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus coefficient (not part of ω).")


# --------------------------------------------------------------------------------------------- KL
@dataclass(frozen=True)
class KLTerm:
    """A KL estimator: its per-token value and its derivative with respect to log π."""

    value: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    grad_wrt_logp: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]




def register_kl_estimator(name: str, term: KLTerm) -> None:
    KL_ESTIMATORS[name] = term


def _k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    # k3 = π_ref/π − 1 − log(π_ref/π)  (Schulman's unbiased, positive estimator)
    log_ratio = ref_logp - logp
    return log_ratio.exp() - 1.0 - log_ratio


def _low_var_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return _k3(logp, ref_logp).clamp(-LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)


def _low_var_kl_grad(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    inside = _k3(logp, ref_logp).abs() <= LOW_VAR_KL_BOUND
    return (1.0 - (ref_logp - logp).exp()) * inside


register_kl_estimator("k1", KLTerm(lambda lp, ref: lp - ref, lambda lp, ref: torch.ones_like(lp)))
register_kl_estimator("k2", KLTerm(lambda lp, ref: 0.5 * (lp - ref).square(), lambda lp, ref: lp - ref))
register_kl_estimator("k3", KLTerm(_k3, lambda lp, ref: 1.0 - (ref - lp).exp()))
register_kl_estimator("low_var_kl", KLTerm(_low_var_kl, _low_var_kl_grad))


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    return _kl_term(estimator).value(logp, ref_logp)


def _kl_term(estimator: str) -> KLTerm:
    try:
        return KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown kl_estimator {estimator!r}; known: {sorted(KL_ESTIMATORS)}") from None


# ------------------------------------------------------------------------------------ aggregation


def register_aggregation(name: str):
    def decorator(fn: Callable[[torch.Tensor, int], torch.Tensor]):
        AGGREGATIONS[name] = fn
        return fn

    return decorator


def _num_sequences(mask: torch.Tensor) -> torch.Tensor:
    # Sequences with no response token (fully padded rows) do not count towards seq-mean.
    return (mask.sum(-1) > 0).sum().clamp_min(1)


@register_aggregation("token-mean")
def _token_mean(mask: torch.Tensor, norm_length: int) -> torch.Tensor:
    return mask / mask.sum().clamp_min(1)


@register_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(mask: torch.Tensor, norm_length: int) -> torch.Tensor:
    lengths = mask.sum(-1, keepdim=True).clamp_min(1)
    return mask / lengths / _num_sequences(mask)


@register_aggregation("seq-mean-token-sum")
def _seq_mean_token_sum(mask: torch.Tensor, norm_length: int) -> torch.Tensor:
    return mask / _num_sequences(mask)


@register_aggregation("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(mask: torch.Tensor, norm_length: int) -> torch.Tensor:
    # Dr. GRPO (TRL's dr_grpo): Σ over tokens / (n_seq · T), one constant length for every sequence.
    # verl's mode of the same name divides by T only; the two differ by the factor n_seq.
    return mask / norm_length / _num_sequences(mask)


def aggregation_weights(mask: torch.Tensor, mode: str, norm_length: int | None = None) -> torch.Tensor:
    """Per-token weights w [B, T] such that the aggregated loss is Σ w_t ℓ_t (zero off the mask)."""
    try:
        weights_of = AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(f"unknown loss_agg {mode!r}; known: {sorted(AGGREGATIONS)}") from None
    return weights_of(mask.float(), norm_length or mask.shape[-1])


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int | None = None) -> torch.Tensor:
    return (per_token * aggregation_weights(mask, mode, norm_length)).sum()


# -------------------------------------------------------------------------------- PPO-clip terms
@dataclass(frozen=True)
class TokenTerms:
    """Per-token loss settings a token method sets (each None: the config's scalar for every token).

    The loss (:func:`ppo_clip_loss`) and ω (:func:`effective_grad_coef`) read the same terms, so a method
    that changes the loss of some tokens (Archer's clip ranges, KL-Cov's penalty, a shaped advantage)
    cannot make ω drift from the gradient actually taken.
    """

    advantages: torch.Tensor | None = None  # A used in place of the batch's (entropy advantage shaping)
    clip_low: torch.Tensor | None = None  # per-token ε_low (Archer)
    clip_high: torch.Tensor | None = None  # per-token ε_high (Archer)
    kl_coef: torch.Tensor | None = None  # per-token β of the KL(π‖π_ref) term (Archer)
    abs_log_ratio_coef: torch.Tensor | None = None  # KL-Cov: + c_t·|log π − log π_old| (0 on untreated tokens)
    unclipped: bool = False  # KL-Cov: the surrogate is −A·r with no clip at all (as in verl's kl_cov)

    def rows(self, start: int, stop: int, width: int) -> TokenTerms:
        cut = lambda t: None if t is None else t[start:stop, :width]
        return TokenTerms(advantages=cut(self.advantages), clip_low=cut(self.clip_low),
                          clip_high=cut(self.clip_high), kl_coef=cut(self.kl_coef),
                          abs_log_ratio_coef=cut(self.abs_log_ratio_coef), unclipped=self.unclipped)

    def to(self, device: torch.device | str) -> TokenTerms:
        move = lambda t: None if t is None else t.to(device)
        return TokenTerms(advantages=move(self.advantages), clip_low=move(self.clip_low),
                          clip_high=move(self.clip_high), kl_coef=move(self.kl_coef),
                          abs_log_ratio_coef=move(self.abs_log_ratio_coef), unclipped=self.unclipped)


@dataclass(frozen=True)
class ClipMasks:
    """Which tokens sit on a flat (zero-gradient) branch of the clipped surrogate."""

    ratio: torch.Tensor
    clipped_high: torch.Tensor  # A > 0 and r > 1 + ε_high
    clipped_low: torch.Tensor  # A < 0 and r < 1 − ε_low
    dual_clipped: torch.Tensor  # A < 0 and r > c

    @property
    def clipped(self) -> torch.Tensor:
        return self.clipped_high | self.clipped_low | self.dual_clipped


def clip_masks(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, config: PolicyLossConfig,
               terms: TokenTerms | None = None) -> ClipMasks:
    ratio = (logp - old_logp).exp()
    if terms is not None and terms.unclipped:
        none = torch.zeros_like(ratio, dtype=torch.bool)
        return ClipMasks(ratio=ratio, clipped_high=none, clipped_low=none, dual_clipped=none)
    clip_low, clip_high = _clip_range(config, terms)
    positive, negative = advantages > 0, advantages < 0
    high = positive & (ratio > 1.0 + clip_high)
    low = negative & (ratio < 1.0 - clip_low)
    if config.dual_clip is not None:
        dual = negative & (ratio > config.dual_clip)
    else:
        dual = torch.zeros_like(high)
    return ClipMasks(ratio=ratio, clipped_high=high, clipped_low=low, dual_clipped=dual)


def _clip_range(config: PolicyLossConfig, terms: TokenTerms | None) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    if terms is None:
        return config.clip_low, config.clip_high
    low = config.clip_low if terms.clip_low is None else terms.clip_low
    high = config.clip_high if terms.clip_high is None else terms.clip_high
    return low, high


def _kl_coef(config: PolicyLossConfig, terms: TokenTerms | None) -> float | torch.Tensor:
    return config.kl_coef if terms is None or terms.kl_coef is None else terms.kl_coef


def _uses_kl(config: PolicyLossConfig, terms: TokenTerms | None) -> bool:
    coef = _kl_coef(config, terms)
    return bool((coef > 0).any()) if isinstance(coef, torch.Tensor) else coef > 0


def effective_grad_coef(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    ref_logp: torch.Tensor | None = None,
    include_aggregation_weight: bool = True,
    terms: TokenTerms | None = None,
) -> torch.Tensor:
    """ω_t = w_t · (1[not clipped] · r · A − β_t · ∂KL_t/∂log π − c_t · sign(log r)), detached, [B, T].

    By the chain rule the gradient of the aggregated loss with respect to token t's logits is
    −ω_t · (e_o − p), so its ℓ2 norm is |ω_t| · G_t (see token_stats). ``w_t`` is the token's
    aggregation weight; ``include_aggregation_weight=False`` reproduces the released GMTS code,
    which leaves it out (identical ranking for token-mean, different for per-sequence modes).
    ``terms`` (a token method's per-token settings) replace A, the clip range and β per token, and add
    KL-Cov's c_t·|log r| (whose derivative is c_t·sign(log r), 0 at r = 1 as autograd's |x|).
    """
    with torch.no_grad():
        if terms is not None and terms.advantages is not None:
            advantages = terms.advantages
        masks = clip_masks(logp, old_logp, advantages, config, terms)
        omega = (~masks.clipped) * masks.ratio * advantages
        if _uses_kl(config, terms):
            if ref_logp is None:
                raise ValueError("kl_coef > 0 needs ref_logp (the reference policy's log-probabilities)")
            omega = omega - _kl_coef(config, terms) * _kl_term(config.kl_estimator).grad_wrt_logp(logp, ref_logp)
        if terms is not None and terms.abs_log_ratio_coef is not None:
            omega = omega - terms.abs_log_ratio_coef * torch.sign(logp - old_logp)
        omega = omega * response_mask
        if include_aggregation_weight:
            omega = omega * aggregation_weights(response_mask, config.loss_agg, config.loss_agg_norm_length)
        return omega.detach()


@dataclass(frozen=True)
class PolicyLossOutput:
    loss: torch.Tensor  # pg_term + reg_term
    pg_term: torch.Tensor  # the aggregated policy-gradient term, with grad (over selected tokens with loss_mask)
    reg_term: torch.Tensor  # β·KL − c·entropy aggregated over every response token, with grad (0 without them)
    pg_loss: torch.Tensor
    kl: torch.Tensor | None
    entropy: torch.Tensor | None
    clip_fraction_high: float
    clip_fraction_low: float
    dual_clip_fraction: float
    approx_kl_old: float  # mean (log π_old − log π), the drift since sampling


def _token_policy_gradient(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, masks,
                           config: PolicyLossConfig, terms: TokenTerms | None) -> torch.Tensor:
    """The per-token clipped surrogate −A·r (dual clip for A < 0), or unclipped, plus KL-Cov's |log r| penalty."""
    surrogate = -advantages * masks.ratio
    if terms is not None and terms.unclipped:
        pg = surrogate
    else:
        clip_low, clip_high = _clip_range(config, terms)
        clipped = -advantages * masks.ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        pg = torch.maximum(surrogate, clipped)
        if config.dual_clip is not None:
            pg = torch.where(advantages < 0, torch.minimum(pg, -advantages * config.dual_clip), pg)
    if terms is not None and terms.abs_log_ratio_coef is not None:
        pg = pg + terms.abs_log_ratio_coef * (logp - old_logp).abs()
    return pg


def _token_regulariser(pg: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor | None,
                       entropy: torch.Tensor | None, config: PolicyLossConfig, terms: TokenTerms | None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The per-token β·KL − entropy-bonus term (shaped and typed as ``pg``), and the KL (None without KL)."""
    regulariser = torch.zeros_like(pg)
    kl = None
    if _uses_kl(config, terms):
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (the reference policy's log-probabilities)")
        kl = kl_penalty(logp, ref_logp, config.kl_estimator)
        regulariser = regulariser + _kl_coef(config, terms) * kl
    if config.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs a differentiable entropy tensor")
        regulariser = regulariser - config.entropy_coef * entropy
    return regulariser, kl


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    ref_logp: torch.Tensor | None = None,
    pg_mask: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    terms: TokenTerms | None = None,
) -> PolicyLossOutput:
    """Clipped surrogate + β·KL − entropy bonus, aggregated per ``config.loss_agg``.

    Token selection enters in one of two ways (see ``selection.SelectionConfig.apply_to``):
    - ``pg_mask``: zero the policy-gradient term of unselected tokens; the aggregation denominator
      still covers every response token (GMTS release, TRL);
    - ``loss_mask``: aggregate the policy-gradient term over the selected tokens only ("80/20"
      code: ``agg_loss(pg_losses, response_mask * entropy_top_mask)``).
    Either way the KL and entropy-bonus terms are aggregated over every response token, each with
    its own aggregation, as verl's actor does.

    ``terms`` (a token method's per-token settings, see :class:`TokenTerms`) replace A, the clip range
    and β per token; KL-Cov's c_t·|log π − log π_old| joins the policy-gradient term (as in verl's
    ``kl_cov``, where it replaces that token's surrogate), and ``unclipped`` drops the clip.
    """
    mask = response_mask.float() if loss_mask is None else (response_mask * loss_mask).float()
    everywhere = response_mask.float()
    if terms is not None and terms.advantages is not None:
        advantages = terms.advantages
    masks = clip_masks(logp, old_logp, advantages, config, terms)
    pg = _token_policy_gradient(logp, old_logp, advantages, masks, config, terms)
    if pg_mask is not None:
        pg = pg * pg_mask
    regulariser, kl = _token_regulariser(pg, logp, ref_logp, entropy, config, terms)
    pg_term = aggregate(pg, mask, config.loss_agg, config.loss_agg_norm_length)
    reg_term = aggregate(regulariser, everywhere, config.loss_agg, config.loss_agg_norm_length)
    loss = pg_term + reg_term

    with torch.no_grad():
        n = response_mask.sum().clamp_min(1)
        return PolicyLossOutput(
            loss=loss,
            pg_term=pg_term,
            reg_term=reg_term,
            pg_loss=aggregate(pg.detach(), mask, config.loss_agg, config.loss_agg_norm_length),
            kl=None if kl is None else (kl.detach() * response_mask).sum() / n,
            entropy=None if entropy is None else (entropy.detach() * response_mask).sum() / n,
            clip_fraction_high=float((masks.clipped_high * response_mask).sum() / n),
            clip_fraction_low=float((masks.clipped_low * response_mask).sum() / n),
            dual_clip_fraction=float((masks.dual_clipped * response_mask).sum() / n),
            approx_kl_old=float(((old_logp - logp.detach()) * response_mask).sum() / n),
        )
