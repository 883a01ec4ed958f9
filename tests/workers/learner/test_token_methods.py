"""The token-method zoo against transcriptions of its reference code paths, and its own invariants.

``_verl_clip_cov`` / ``_verl_kl_cov`` transcribe verl's ``compute_policy_loss_clip_cov`` /
``compute_policy_loss_kl_cov`` (volcengine/verl, verl/trainer/ppo/core_algos.py) for one micro-batch on
one rank with token-mean aggregation: ``masked_mean`` is verl_F's (sum / (count + 1e-8)), the random draw
is verl's ``torch.randperm`` on the global generator, seeded here. The lab's methods must give the same
masks and the same loss (to 1e-6) on random inputs with the same seed.
"""

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pydantic import ValidationError

from workers.learner.diagnostics import selection_diagnostics
from workers.learner.losses import PolicyLossConfig, effective_grad_coef, ppo_clip_loss
from workers.learner.selection import SELECTION_METHODS, SelectionConfig, select_tokens
from workers.learner.token_methods import EntropyAdvantageConfig, entropy_shaped_advantages, treated_count
from workers.learner.token_stats import token_stats_from_logits


# ----------------------------------------------------------------------- verl transcriptions (reference)
def _masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def _verl_clip_cov(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_cov_ratio, lb, ub):
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses1 = -advantages * ratio
    corr = torch.ones_like(advantages)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - _masked_mean(advantages, response_mask)) * (
        log_prob - _masked_mean(log_prob.detach(), response_mask))
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    idx = torch.nonzero((cov_all < ub) & (cov_all > lb) & (response_mask > 0))
    if len(idx) > 0:
        idx = idx[torch.randperm(len(idx))[: min(clip_num, len(idx))]]
    corr[idx[:, 0], idx[:, 1]] = 0
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    return _masked_mean(pg_losses, response_mask), corr == 0


def _verl_kl_cov(old_log_prob, log_prob, advantages, response_mask, kl_cov_ratio, ppo_kl_coef):
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * negative_approx_kl.abs()
    valid = response_mask > 0
    valid_idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    adv, logp = advantages[valid].detach().reshape(-1), log_prob[valid].detach().reshape(-1)
    penalised = torch.zeros_like(valid)
    if len(adv):
        cov = (adv - adv.mean()) * (logp - logp.mean())
        top = valid_idx[torch.topk(cov, max(1, int(len(cov) * kl_cov_ratio)), largest=True).indices]
        rows, cols = top // advantages.shape[1], top % advantages.shape[1]
        pg_losses = pg_losses.clone()
        pg_losses[rows, cols] = pg_losses_kl[rows, cols]
        penalised[rows, cols] = True
    return _masked_mean(pg_losses, response_mask), penalised


# --------------------------------------------------------------------------------------- random inputs
def _inputs(seed, rows=12, length=40, group_size=4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).float()
    logp = -torch.rand(rows, length, generator=g) * 4  # spread, so that some covariances lie in (1, 5)
    old_logp = logp + 0.3 * torch.randn(rows, length, generator=g)  # some ratios beyond 1 ± 0.2
    advantages = (torch.randn(rows, generator=g) * 2)[:, None].expand(rows, length).contiguous()
    entropy = torch.rand(rows, length, generator=g) * 3
    return dict(response_mask=mask, logp=logp, old_logp=old_logp, advantages=advantages, entropy=entropy,
                group_ids=torch.arange(rows) // group_size)


def _lab_loss(b, selection, config, loss_config):
    pg_mask, loss_mask = selection.loss_masks(config.apply_to)
    return ppo_clip_loss(logp=b["logp"], old_logp=b["old_logp"], advantages=b["advantages"],
                         response_mask=b["response_mask"], config=loss_config, pg_mask=pg_mask, loss_mask=loss_mask,
                         terms=selection.terms).loss


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ratio", [0.0002, 0.05, 0.3])
@pytest.mark.parametrize("ratio_clip", [1.0, None])
def test_clip_cov_matches_verl_masks_and_loss(seed, ratio, ratio_clip):
    """ratio_clip 1.0: the authors' scripts (clip_ratio_low = clip_ratio_high = 1), whatever the loss's clip;
    None: the loss's clip (0.2 / 0.28) goes to verl's cliprange_low / cliprange_high."""
    b = _inputs(seed)
    loss_config = PolicyLossConfig(clip_low=0.2, clip_high=0.28)
    config = SelectionConfig(method="clip_cov", ratio=ratio, scope="micro_batch",
                             covariance={"ratio_clip": ratio_clip})
    selection = select_tokens(**b, config=config, loss_config=loss_config,
                              generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)  # verl draws from the global generator
    verl_low, verl_high = (0.2, 0.28) if ratio_clip is None else (ratio_clip, ratio_clip)
    verl_loss, verl_detached = _verl_clip_cov(b["old_logp"], b["logp"], b["advantages"], b["response_mask"],
                                              verl_low, verl_high, ratio, 1.0, 5.0)
    assert torch.equal(selection.treated, verl_detached)
    from workers.learner.losses import clip_masks

    clipped = clip_masks(b["logp"], b["old_logp"], b["advantages"], loss_config, selection.terms).clipped
    band = b["response_mask"].bool() & ~clipped & (selection.scores > 1.0) & (selection.scores < 5.0)
    wanted = treated_count(int(b["response_mask"].sum()), ratio)
    assert int(selection.treated.sum()) == min(wanted, int(band.sum())) and (ratio < 0.01 or wanted > 1)
    assert torch.equal(selection.mask, b["response_mask"].bool() & ~verl_detached)
    torch.testing.assert_close(_lab_loss(b, selection, config, loss_config), verl_loss, atol=1e-6, rtol=0)


def test_clip_cov_ratio_clip_one_really_loosens_the_ppo_clip():
    """The inputs hold ratios beyond 1 + 0.28 but inside [0, 2]: clipped under the loss's clip, not under ε = 1."""
    b = _inputs(2)
    from workers.learner.losses import clip_masks

    loss_config = PolicyLossConfig(clip_low=0.2, clip_high=0.28)
    default = select_tokens(**b, config=SelectionConfig(method="clip_cov", ratio=0.05, scope="micro_batch"),
                            loss_config=loss_config, generator=torch.Generator().manual_seed(0))
    assert (default.terms.clip_low == 1.0).all() and (default.terms.clip_high == 1.0).all()
    loose = clip_masks(b["logp"], b["old_logp"], b["advantages"], loss_config, default.terms).clipped
    tight = clip_masks(b["logp"], b["old_logp"], b["advantages"], loss_config).clipped
    assert int(tight.sum()) > int(loose.sum())
    own = select_tokens(**b, config=SelectionConfig(method="clip_cov", ratio=0.05, scope="micro_batch",
                                                     covariance={"ratio_clip": None}),
                        loss_config=loss_config, generator=torch.Generator().manual_seed(0))
    assert own.terms is None


def test_clip_cov_draws_from_the_band_of_unclipped_tokens_only():
    b = _inputs(1)
    loss_config = PolicyLossConfig()
    config = SelectionConfig(method="clip_cov", ratio=1.0, scope="micro_batch",  # the loss's clip 0.2 decides
                             covariance={"clip_lower": 1.0, "clip_upper": 5.0, "ratio_clip": None})
    selection = select_tokens(**b, config=config, loss_config=loss_config)
    from workers.learner.losses import clip_masks

    clipped = clip_masks(b["logp"], b["old_logp"], b["advantages"], loss_config).clipped
    band = b["response_mask"].bool() & ~clipped & (selection.scores > 1.0) & (selection.scores < 5.0)
    assert band.sum() > 3 and clipped[b["response_mask"].bool()].any()  # the test can fail both ways
    assert torch.equal(selection.treated, band)  # ρ = 1 takes every candidate, nothing else


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ratio", [0.0002, 0.002, 0.2])
def test_kl_cov_matches_verl_masks_and_loss(seed, ratio):
    b = _inputs(seed)
    loss_config = PolicyLossConfig(clip_low=0.2, clip_high=0.2)  # verl's kl_cov ignores the clip: so must we
    config = SelectionConfig(method="kl_cov", ratio=ratio, scope="micro_batch", covariance={"kl_coef": 1.0})
    selection = select_tokens(**b, config=config, loss_config=loss_config)
    verl_loss, verl_penalised = _verl_kl_cov(b["old_logp"], b["logp"], b["advantages"], b["response_mask"], ratio, 1.0)
    assert torch.equal(selection.treated, verl_penalised)
    assert torch.equal(selection.mask, b["response_mask"].bool())  # KL-Cov masks nothing
    assert int(selection.treated.sum()) == treated_count(int(b["response_mask"].sum()), ratio)
    torch.testing.assert_close(_lab_loss(b, selection, config, loss_config), verl_loss, atol=1e-6, rtol=0)
    clipped = ppo_clip_loss(logp=b["logp"], old_logp=b["old_logp"], advantages=b["advantages"],
                            response_mask=b["response_mask"], config=loss_config).loss
    assert not torch.isclose(clipped, verl_loss, atol=1e-4)  # the clip would have changed it


# ------------------------------------------------------------------- cross-rank covariance population
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _global_worker(rank, world, port, method, ratio, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        b = _inputs(20, rows=12)
        half = {k: v[rank * 6:(rank + 1) * 6] for k, v in b.items()}  # each rank holds half of one population
        config = SelectionConfig(method=method, ratio=ratio, scope="global")
        sel = select_tokens(**half, config=config, loss_config=PolicyLossConfig(), tie_seed=7)
        results[rank] = sel.treated.clone()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # a gloo process group of real ranks
@pytest.mark.parametrize("method,ratio", [("kl_cov", 0.05), ("clip_cov", 0.05)])
def test_global_covariance_population_is_exactly_the_single_process_one(method, ratio):
    """scope='global': means, n, the top-k and the random draw span every rank; verl's is per rank."""
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_global_worker, args=(2, _free_port(), method, ratio, results), nprocs=2, join=True)
    across_ranks = torch.cat([results[0], results[1]])
    b = _inputs(20, rows=12)
    one = select_tokens(**b, config=SelectionConfig(method=method, ratio=ratio, scope="global"),
                        loss_config=PolicyLossConfig(), tie_seed=7)
    assert torch.equal(across_ranks, one.treated)
    per_rank = [select_tokens(**{k: v[r * 6:(r + 1) * 6] for k, v in b.items()}, loss_config=PolicyLossConfig(),
                              config=SelectionConfig(method=method, ratio=ratio, scope="micro_batch"),
                              generator=torch.Generator().manual_seed(7)).treated for r in range(2)]
    assert not torch.equal(torch.cat(per_rank), one.treated)  # per-rank populations differ from the global one


# ------------------------------------------------------------------------------ entropy advantage shaping
def test_entropy_advantage_is_a_plus_capped_bonus_and_keeps_sign_and_zero():
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]])
    entropy = torch.tensor([[0.5, 10.0], [0.5, 10.0], [3.0, 3.0]])
    mask = torch.ones(3, 2)
    shaped = entropy_shaped_advantages(advantages, entropy, mask, EntropyAdvantageConfig(alpha=0.4, kappa=2.0))
    torch.testing.assert_close(shaped, torch.tensor([[1.2, 1.5], [-0.8, -0.5], [0.0, 0.0]]))
    # A = 0 stays 0 (entropy alone earns nothing), a negative advantage stays negative.
    assert (shaped[2] == 0).all() and (shaped[1] < 0).all()


def test_entropy_adv_method_feeds_the_loss_the_shaped_advantages():
    b = _inputs(3)
    config = SelectionConfig(method="entropy_adv")
    selection = select_tokens(**b, config=config, loss_config=PolicyLossConfig())
    expected = entropy_shaped_advantages(b["advantages"], b["entropy"], b["response_mask"], config.entropy_advantage)
    assert torch.equal(selection.terms.advantages, expected) and torch.equal(selection.mask, b["response_mask"].bool())
    loss = _lab_loss(b, selection, config, PolicyLossConfig())
    direct = ppo_clip_loss(logp=b["logp"], old_logp=b["old_logp"], advantages=expected,
                           response_mask=b["response_mask"], config=PolicyLossConfig()).loss
    torch.testing.assert_close(loss, direct, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------------ archer
def _archer_masks(entropy, response_mask, token_entropy_quantile):
    """Transcription of ArcherCodeR's verl/workers/actor/dp_actor.py (use_token_entropy_separate): the threshold
    is each response's own nanquantile; its ``high_entropy_mask`` names the LOW-entropy tokens (≤ threshold)."""
    masked_entropy = torch.where(response_mask.bool(), entropy.detach(), torch.nan)
    q80 = torch.nanquantile(masked_entropy, q=token_entropy_quantile, dim=-1, keepdim=True)
    low = (masked_entropy <= q80) & response_mask.bool()
    high = (masked_entropy > q80) & response_mask.bool()
    return low, high


def _archer_pg_loss(old_log_prob, log_prob, advantages, response_mask, low_mask, low_clip, high_clip, clip_ratio_c):
    """Transcription of ArcherCodeR's compute_policy_loss (token-mean), dual clip included."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    clipped = torch.where(low_mask, torch.clamp(ratio, 1 - low_clip, 1 + low_clip),
                          torch.clamp(ratio, 1 - high_clip, 1 + high_clip))
    pg_losses2 = -advantages * clipped
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.min(-advantages * clip_ratio_c, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return _masked_mean(pg_losses, response_mask)


@pytest.mark.parametrize("seed", range(6))
def test_archer_per_response_matches_the_authors_masks_and_policy_loss(seed):
    b = _inputs(seed)
    # Rows of 6 and 11 tokens put the 0.8-quantile exactly on a token ((n − 1)·0.8 is whole): that token is low.
    b["response_mask"][0] = (torch.arange(40) < 6).float()
    b["response_mask"][1] = (torch.arange(40) < 11).float()
    loss_config = PolicyLossConfig(clip_low=0.2, clip_high=0.2, dual_clip=10.0)  # the authors' script
    config = SelectionConfig(method="archer", ratio=0.2, scope="response", rule="quantile")
    selection = select_tokens(**b, config=config, loss_config=loss_config)
    low, high = _archer_masks(b["entropy"], b["response_mask"], 0.8)
    assert torch.equal(selection.treated, high) and torch.equal(selection.mask, b["response_mask"].bool())
    assert int(high[0].sum()) == 1 and int(high[1].sum()) == 2  # strictly above: the threshold token stays low
    authors = _archer_pg_loss(b["old_logp"], b["logp"], b["advantages"], b["response_mask"], low, 0.2, 0.5, 10.0)
    torch.testing.assert_close(_lab_loss(b, selection, config, loss_config), authors, atol=1e-6, rtol=0)


def test_response_scope_ranks_each_response_on_its_own():
    b = _inputs(3)
    selection = select_tokens(**b, config=SelectionConfig(method="ets", ratio=0.25, scope="response"))
    lengths = b["response_mask"].sum(-1).long()
    assert torch.equal(selection.mask.sum(-1), torch.ceil(lengths * 0.25).long())
    for row in range(len(lengths)):
        kept = b["entropy"][row][selection.mask[row]]
        dropped = b["entropy"][row][b["response_mask"][row].bool() & ~selection.mask[row]]
        assert dropped.numel() == 0 or kept.min() > dropped.max()


def test_archer_loosens_clip_and_weakens_kl_on_high_entropy_tokens_only():
    b = _inputs(4)
    loss_config = PolicyLossConfig(clip_low=0.2, clip_high=0.2, kl_coef=0.01)
    config = SelectionConfig(method="archer", ratio=0.2, scope="micro_batch", rule="quantile",
                             archer={"high_entropy_clip": 0.5, "high_entropy_kl_scale": 0.0})
    selection = select_tokens(**b, config=config, loss_config=loss_config)
    mask = b["response_mask"].bool()
    high = selection.treated
    threshold = torch.quantile(b["entropy"][mask], 0.8)
    assert torch.equal(high, mask & (b["entropy"] >= threshold))
    assert torch.equal(selection.mask, mask)  # no masking
    terms = selection.terms
    assert (terms.clip_low[high] == 0.5).all() and (terms.clip_high[~high] == 0.2).all()
    assert (terms.kl_coef[high] == 0.0).all() and (terms.kl_coef[~high] == 0.01).all()
    # The per-token loss by hand: each token's own clip and β.
    ref_logp = b["logp"] + 0.2
    ratio = (b["logp"] - b["old_logp"]).exp()
    eps = torch.where(high, 0.5, 0.2)
    pg = torch.maximum(-b["advantages"] * ratio, -b["advantages"] * torch.clamp(ratio, 1 - eps, 1 + eps))
    log_ratio = ref_logp - b["logp"]
    kl = torch.where(high, 0.0, 0.01) * (log_ratio.exp() - 1 - log_ratio)
    by_hand = ((pg + kl) * b["response_mask"]).sum() / b["response_mask"].sum()
    out = ppo_clip_loss(logp=b["logp"], old_logp=b["old_logp"], advantages=b["advantages"],
                        response_mask=b["response_mask"], config=loss_config, ref_logp=ref_logp, terms=terms)
    torch.testing.assert_close(out.loss, by_hand, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------- GMTS variants
def test_h_abs_adv_is_what_gmts_reduces_to_on_policy():
    b = _inputs(5)
    on_policy = {**b, "old_logp": b["logp"]}  # r = 1, no KL, token-mean: ω = A / N
    for scope in ("group", "micro_batch"):
        gmts = select_tokens(**on_policy, config=SelectionConfig(method="gmts", ratio=0.3, scope=scope))
        h_abs_adv = select_tokens(**on_policy, config=SelectionConfig(method="h_abs_adv", ratio=0.3, scope=scope))
        assert torch.equal(gmts.mask, h_abs_adv.mask)
        torch.testing.assert_close(gmts.scores * b["response_mask"].sum(), h_abs_adv.scores)
    off_policy = select_tokens(**b, config=SelectionConfig(method="gmts", ratio=0.3, scope="micro_batch"))
    h = select_tokens(**b, config=SelectionConfig(method="h_abs_adv", ratio=0.3, scope="micro_batch"))
    assert not torch.equal(off_policy.mask, h.mask)  # with clipping the two differ


def test_abs_omega_ranks_by_omega_without_entropy():
    b = _inputs(6)
    loss_config = PolicyLossConfig()
    selection = select_tokens(**b, config=SelectionConfig(method="abs_omega", ratio=0.25, scope="micro_batch"),
                              loss_config=loss_config)
    omega = effective_grad_coef(b["logp"], b["old_logp"], b["advantages"], b["response_mask"], loss_config).abs()
    torch.testing.assert_close(selection.scores, omega.float() * b["response_mask"])
    eligible = omega > 0
    assert torch.equal(selection.eligible, eligible)
    kept = selection.mask
    assert kept.sum() == math.ceil(0.25 * int(eligible.sum()))
    assert omega[kept].min() >= omega[eligible & ~kept].max()


# ------------------------------------------------------------------- ω stays the gradient under the terms
@pytest.mark.parametrize("method,ratio", [("kl_cov", 0.2), ("archer", 0.3), ("entropy_adv", None)])
@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_autograd_gradient_equals_omega_times_g_under_token_terms(method, ratio, loss_agg):
    g = torch.Generator().manual_seed(11)
    rows, length, vocab = 6, 9, 13
    logits = (torch.randn(rows, length, vocab, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    tokens = torch.randint(0, vocab, (rows, length), generator=g)
    mask = (torch.arange(length)[None] < torch.tensor([9, 8, 6, 4, 2, 1])[:, None]).double()
    stats = token_stats_from_logits(logits, tokens, with_grad_norm=True)
    old_logp = stats.logp.detach() + 0.3 * torch.randn(rows, length, generator=g, dtype=torch.float64)
    ref_logp = stats.logp.detach() + 0.5 * torch.randn(rows, length, generator=g, dtype=torch.float64)
    advantages = torch.randn(rows, generator=g, dtype=torch.float64)[:, None].expand(rows, length).contiguous()
    loss_config = PolicyLossConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.05, loss_agg=loss_agg)
    config = SelectionConfig(method=method, ratio=ratio, scope="micro_batch")
    selection = select_tokens(response_mask=mask, entropy=stats.entropy.detach(), advantages=advantages,
                              group_ids=torch.zeros(rows, dtype=torch.long), config=config, loss_config=loss_config,
                              logp=stats.logp.detach(), old_logp=old_logp, ref_logp=ref_logp)
    out = ppo_clip_loss(logp=stats.logp, old_logp=old_logp, advantages=advantages, response_mask=mask,
                        config=loss_config, ref_logp=ref_logp, terms=selection.terms)
    (grad,) = torch.autograd.grad(out.loss, logits)
    omega = effective_grad_coef(stats.logp, old_logp, advantages, mask, loss_config, ref_logp, terms=selection.terms)
    torch.testing.assert_close(omega.abs() * stats.grad_norm, grad.norm(dim=-1), atol=1e-6, rtol=0)
    plain = effective_grad_coef(stats.logp, old_logp, advantages, mask, loss_config, ref_logp)
    assert not torch.allclose(plain, omega)  # the method changes ω, so the test can fail


# ------------------------------------------------------------------------------------ diagnostics, config
@pytest.mark.parametrize("method,ratio", [("clip_cov", 0.05), ("kl_cov", 0.05), ("archer", 0.2),
                                          ("entropy_adv", None), ("h_abs_adv", 0.2), ("abs_omega", 0.2)])
def test_every_zoo_method_logs_the_same_selection_diagnostics(method, ratio):
    b = _inputs(7)
    config = SelectionConfig(method=method, ratio=ratio, scope="micro_batch")
    selection = select_tokens(**b, config=config, loss_config=PolicyLossConfig())
    advantages = b["advantages"] if selection.terms is None or selection.terms.advantages is None \
        else selection.terms.advantages
    metrics = selection_diagnostics(selection, b["response_mask"], b["entropy"], advantages=advantages)
    for key in ("selection/zero_advantage_share", "selection/net_signed_weight", "selection/entropy_selected",
                "selection/entropy_all", "selection/selected_fraction"):
        assert key in metrics and not math.isnan(metrics[key]), key
    if selection.treated is not None:
        treated = selection.treated.float().sum() / b["response_mask"].sum()
        assert metrics["selection/treated_fraction"] == pytest.approx(float(treated))
        assert "selection/treated_net_signed_weight" in metrics and "selection/entropy_treated" in metrics


@pytest.mark.parametrize("kwargs,field", [
    ({"method": "clip_cov", "ratio": 0.01}, "scope"),  # the default scope, group, is not a covariance population
    ({"method": "entropy_adv", "ratio": 0.2}, "ratio"),
    ({"method": "kl_cov", "scope": "micro_batch"}, "ratio"),
    ({"method": "clip_cov", "ratio": 0.01, "scope": "micro_batch",
      "covariance": {"clip_lower": 5.0, "clip_upper": 1.0}}, "clip_upper"),
    ({"method": "entropy_adv", "entropy_advantage": {"kappa": 1.0}}, "kappa"),
    ({"method": "archer", "ratio": 0.2, "archer": {"high_entropy_clip": 1.0}}, "high_entropy_clip"),
    ({"method": "archer", "ratio": 0.2, "scope": "response", "rule": "count"}, "rule"),  # the authors' rule only
    ({"method": "clip_cov", "ratio": 0.01, "scope": "micro_batch", "covariance": {"ratio_clip": 1.5}}, "ratio_clip"),
    ({"method": "kl_cov", "ratio": 0.01, "scope": "response"}, "scope"),  # no paper ranks covariance per answer
])
def test_bad_zoo_config_names_the_field(kwargs, field):
    with pytest.raises(ValidationError, match=field):
        SelectionConfig(**kwargs)


def test_every_registered_method_says_what_it_is():
    for name, method in SELECTION_METHODS.items():
        assert method.family and method.weight and method.changes and method.reference, name


def test_docs_methods_has_a_row_and_a_card_for_every_registered_method():
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "methods.md").read_text()
    for name, method in SELECTION_METHODS.items():
        assert f"| `{name}` | {method.family} |" in text, name
        if name not in ("none", "random"):
            assert f"`{name}`" in text.split("## Method cards", 1)[1], name
