"""Per-token statistics of the policy, all read off one softmax of the logits.

For a token o_t sampled from p = softmax(z / τ):
  log π(o_t)  = log p_o
  H_t         = −Σ_k p_k log p_k                      (the entropy ETS ranks by)
  G_t         = ‖∂ log π(o_t) / ∂(z/τ)‖₂ = ‖e_o − p‖₂ = √(1 − 2 p_o + Σ_k p_k²)

G_t is the exact ℓ2 norm of the gradient of the token's log-probability with respect to its
(temperature-scaled) logits; the GMTS paper uses H_t as a proxy for it. With respect to the raw
logits z the norm is G_t / τ — a constant factor that does not change any ranking.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenStats:
    """Per-token tensors of shape [B, T]."""

    logp: torch.Tensor
    entropy: torch.Tensor
    grad_norm: torch.Tensor | None = None


def token_stats_from_logits(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    with_grad_norm: bool = False,
) -> TokenStats:
    """Log-probabilities of ``tokens`` plus entropy (and optionally G) from ``logits`` [B, T, V].

    ``logp`` keeps the autograd graph (it feeds the loss); entropy and G are detached: they only
    rank tokens. An entropy bonus in the loss uses :func:`entropy_from_logits` instead.
    """
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} disagree on [B, T]")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = _upcast(logits) / temperature if temperature != 1.0 else _upcast(logits)
    log_probs = torch.log_softmax(scaled, dim=-1)
    logp = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        detached = log_probs.detach()
        probs = detached.exp()
        entropy = -(probs * detached).sum(-1)
        grad_norm = None
        if with_grad_norm:
            p_sampled = logp.detach().exp()
            squared = 1.0 - 2.0 * p_sampled + probs.square().sum(-1)
            grad_norm = squared.clamp_min(0.0).sqrt()
    return TokenStats(logp=logp, entropy=entropy, grad_norm=grad_norm)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Differentiable per-token entropy [B, T] (for an entropy bonus in the loss)."""
    log_probs = torch.log_softmax(_upcast(logits) / temperature, dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    # bf16/fp16 softmax loses the small probabilities entropy and G depend on; fp64 stays fp64.
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
