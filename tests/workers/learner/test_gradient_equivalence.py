"""Acceptance: |ω|·G is exactly the per-token ℓ2 norm of the loss gradient w.r.t. the logits.

For random logits, advantages, old/ref policies, every aggregation mode and every KL estimator,
autograd's gradient of the real aggregated loss with respect to token t's logits has norm
|ω_t| · G_t, where ω comes from effective_grad_coef and G from token_stats_from_logits.
"""

import itertools

import pytest
import torch

from workers.learner.losses import AGGREGATIONS, KL_ESTIMATORS, PolicyLossConfig, effective_grad_coef, ppo_clip_loss
from workers.learner.token_stats import token_stats_from_logits


def _random_batch(seed: int, batch=6, length=9, vocab=13):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64) * 2
    tokens = torch.randint(0, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.float64)
    for row in range(batch):  # ragged lengths, one row of a single token
        mask[row, max(1, length - row * 2):] = 0
    # old/ref log-probs near the current ones, so that some ratios are clipped and some are not
    with torch.no_grad():
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    old_logp = logp + 0.3 * torch.randn(batch, length, generator=g, dtype=torch.float64)
    ref_logp = logp + 0.5 * torch.randn(batch, length, generator=g, dtype=torch.float64)
    advantages = torch.randn(batch, generator=g, dtype=torch.float64)
    advantages[0] = 0.0  # a zero-advantage row
    return logits, tokens, mask, old_logp, ref_logp, advantages[:, None].expand(batch, length).contiguous()


@pytest.mark.parametrize(
    "loss_agg,kl_estimator", list(itertools.product(sorted(AGGREGATIONS), sorted(KL_ESTIMATORS)))
)
@pytest.mark.parametrize("dual_clip", [None, 1.5])
def test_autograd_gradient_norm_equals_omega_times_g(loss_agg, kl_estimator, dual_clip):
    logits, tokens, mask, old_logp, ref_logp, advantages = _random_batch(seed=hash((loss_agg, kl_estimator)) % 1000)
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.28, dual_clip=dual_clip, kl_coef=0.05,
                              kl_estimator=kl_estimator, loss_agg=loss_agg)
    logits.requires_grad_(True)
    stats = token_stats_from_logits(logits, tokens, with_grad_norm=True)
    out = ppo_clip_loss(logp=stats.logp, old_logp=old_logp, advantages=advantages, response_mask=mask,
                        config=config, ref_logp=ref_logp)
    (grad,) = torch.autograd.grad(out.loss, logits)
    autograd_norm = grad.norm(dim=-1)

    omega = effective_grad_coef(stats.logp, old_logp, advantages, mask, config, ref_logp)
    predicted = omega.abs() * stats.grad_norm
    torch.testing.assert_close(predicted, autograd_norm, atol=1e-5, rtol=0)
    # The test must be able to fail: some tokens are clipped, others are not.
    assert (omega == 0).any() and (omega != 0).sum() > mask.sum() / 2


def test_released_convention_drops_only_the_aggregation_weight():
    logits, tokens, mask, old_logp, ref_logp, advantages = _random_batch(seed=3)
    config = PolicyLossConfig(kl_coef=0.0, loss_agg="seq-mean-token-mean")
    logp = token_stats_from_logits(logits, tokens).logp
    exact = effective_grad_coef(logp, old_logp, advantages, mask, config, include_aggregation_weight=True)
    released = effective_grad_coef(logp, old_logp, advantages, mask, config, include_aggregation_weight=False)
    lengths = mask.sum(-1, keepdim=True)
    n_seq = (lengths > 0).sum()
    torch.testing.assert_close(exact, released / lengths / n_seq * mask)


def test_grad_norm_matches_autograd_of_single_token_logprob():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 1, 50, generator=g, dtype=torch.float64, requires_grad=True)
    token = torch.tensor([[7]])
    stats = token_stats_from_logits(logits, token, with_grad_norm=True)
    (grad,) = torch.autograd.grad(stats.logp.sum(), logits)
    torch.testing.assert_close(stats.grad_norm, grad.norm(dim=-1))


@pytest.mark.parametrize("loss_agg", sorted(AGGREGATIONS))
@pytest.mark.parametrize("kl_estimator", ["k3", "low_var_kl"])
def test_apply_to_loss_masks_only_the_policy_gradient_term_with_kl_on(loss_agg, kl_estimator):
    """apply_to='loss' ("80/20" code): the policy-gradient term is aggregated over the selected tokens;
    the KL term still over every response token. So token t's logits gradient is
    −(ω_t^pg[selected] + ω_t^KL[all]) · (e_o − p), its norm |ω^pg + ω^KL| · G."""
    logits, tokens, mask, old_logp, ref_logp, advantages = _random_batch(seed=hash((loss_agg, kl_estimator, 1)) % 1000)
    selected = (torch.rand(mask.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) < 0.4)
    selected = (selected & mask.bool()).double()
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.05, kl_estimator=kl_estimator, loss_agg=loss_agg)
    logits.requires_grad_(True)
    stats = token_stats_from_logits(logits, tokens, with_grad_norm=True)
    out = ppo_clip_loss(logp=stats.logp, old_logp=old_logp, advantages=advantages, response_mask=mask,
                        config=config, ref_logp=ref_logp, loss_mask=selected)
    (grad,) = torch.autograd.grad(out.loss, logits)

    pg_only = config.model_copy(update={"kl_coef": 0.0})
    omega_pg = effective_grad_coef(stats.logp, old_logp, advantages, mask * selected, pg_only)
    omega_kl = effective_grad_coef(stats.logp, old_logp, torch.zeros_like(advantages), mask, config, ref_logp)
    predicted = (omega_pg + omega_kl).abs() * stats.grad_norm
    torch.testing.assert_close(predicted, grad.norm(dim=-1), atol=1e-5, rtol=0)
    # The KL gradient reaches the unselected tokens; their policy-gradient term does not.
    unselected = mask.bool() & ~selected.bool()
    assert (grad.norm(dim=-1)[unselected] > 0).all() and (omega_pg[unselected] == 0).all()
    # And the loss is the selected-token pg aggregate plus the all-token KL aggregate.
    kl = out.reg_term.detach()
    assert float(kl) > 0 and torch.isclose(out.loss.detach(), out.pg_term.detach() + kl)
