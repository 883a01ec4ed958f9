"""Each reference recipe against an independent transcription of its reference's code path.

The transcriptions below are written from the public code (cited per function), in plain torch,
without importing it (verl and TRL are not installed here). On random inputs each recipe must select
exactly the same tokens and give the same loss (to 1e-6) as its reference.
"""

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workers.learner.losses import PolicyLossConfig, ppo_clip_loss
from workers.learner.recipes import RECIPES
from workers.learner.selection import SelectionConfig, select_tokens


def _inputs(seed, groups=4, group_size=4, width=12):
    g = torch.Generator().manual_seed(seed)
    rows = groups * group_size
    lengths = torch.randint(3, width + 1, (rows,), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).double()
    entropy = torch.rand(rows, width, generator=g, dtype=torch.float64) * 3 * mask
    logp = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 2
    old_logp = logp + 0.25 * torch.randn(rows, width, generator=g, dtype=torch.float64)
    ref_logp = logp + 0.3 * torch.randn(rows, width, generator=g, dtype=torch.float64)
    rewards = (torch.rand(rows, generator=g) < 0.5).double()
    by_group = rewards.view(groups, group_size)
    advantages = ((by_group - by_group.mean(-1, keepdim=True)) / (by_group.std(-1, keepdim=True) + 1e-6)).flatten()
    group_ids = torch.arange(groups).repeat_interleave(group_size)
    return dict(mask=mask, entropy=entropy, logp=logp * mask, old_logp=old_logp * mask, ref_logp=ref_logp * mask,
                advantages=advantages, group_ids=group_ids)


def _ours(x, recipe, ratio, loss_config):
    selection = select_tokens(
        response_mask=x["mask"], entropy=x["entropy"], advantages=x["advantages"], group_ids=x["group_ids"],
        config=SelectionConfig(recipe=recipe, ratio=ratio), loss_config=loss_config, logp=x["logp"],
        old_logp=x["old_logp"], ref_logp=x["ref_logp"])
    pg_mask, loss_mask = selection.loss_masks(RECIPES[recipe].fields["apply_to"])
    out = ppo_clip_loss(logp=x["logp"], old_logp=x["old_logp"], advantages=x["advantages"][:, None].expand_as(x["mask"]),
                        response_mask=x["mask"], config=loss_config, ref_logp=x["ref_logp"], pg_mask=pg_mask,
                        loss_mask=loss_mask, entropy=x["entropy"])
    return selection.mask, out.loss


# ------------------------------------------------------------------- verl (the 80/20 fork and the GMTS fork)
def verl_agg_loss(loss_mat, loss_mask, mode):
    # verl/trainer/ppo/core_algos.py: agg_loss
    if mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    if mode == "seq-mean-token-sum":
        return (loss_mat * loss_mask).sum(-1).mean()
    if mode == "seq-mean-token-mean":
        return ((loss_mat * loss_mask).sum(-1) / loss_mask.sum(-1)).mean()
    raise ValueError(mode)


def verl_vanilla_pg_losses(old_log_prob, log_prob, advantages, clip_low, clip_high, clip_ratio_c=3.0):
    # verl/trainer/ppo/core_algos.py: compute_policy_loss_vanilla (per-token part, dual-clip always on)
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.min(-advantages * clip_ratio_c, clip_pg_losses1)
    return torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)


def verl_low_var_kl(logprob, ref_logprob):
    # verl/trainer/ppo/core_algos.py: kl_penalty(..., "low_var_kl")
    kl = ref_logprob - logprob
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def verl_actor_loss(x, advantages, pg_mask, cfg):
    # verl/workers/actor/dp_actor.py: update_policy — pg term over pg_mask; entropy and KL over response_mask
    pg = verl_vanilla_pg_losses(x["old_logp"], x["logp"], advantages, cfg.clip_low, cfg.clip_high)
    loss = verl_agg_loss(pg, pg_mask, cfg.loss_agg)
    loss = loss - cfg.entropy_coef * verl_agg_loss(x["entropy"], x["mask"], cfg.loss_agg)
    return loss + cfg.kl_coef * verl_agg_loss(verl_low_var_kl(x["logp"], x["ref_logp"]), x["mask"], cfg.loss_agg)


def get_global_entropy_top_mask(entropy, response_mask, top_ratio):
    # Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR, verl/trainer/ppo/core_algos.py: get_global_entropy_top_mask
    flat_entropy, flat_mask = entropy.flatten(), response_mask.flatten().bool()
    response_entropy = flat_entropy[flat_mask]
    top_k = max(1, int(len(response_entropy) * top_ratio + 0.9999))
    _, topk_idx = torch.topk(response_entropy, k=top_k)
    top_positions = flat_mask.nonzero(as_tuple=False).squeeze(1)[topk_idx]
    out = torch.zeros_like(flat_entropy, dtype=torch.long)
    out[top_positions] = 1
    return out.view_as(entropy)


def verl_loss_config(loss_agg, **extra):
    # The loss around the recipe as verl's actor computes it: dual-clip c = 3, low_var_kl.
    return PolicyLossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_estimator="low_var_kl",
                            loss_agg=loss_agg, **extra)


VERL_AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


@pytest.mark.parametrize("seed", range(3))
def test_ets_8020_matches_the_8020_code(seed, loss_agg="token-mean"):
    """Beyond-the-80-20-Rule-RLVR, dp_actor.update_policy: entropy_top_mask over each micro-batch, then
    compute_policy_loss_vanilla(..., entropy_top_mask) → agg_loss(pg, response_mask * entropy_top_mask).

    token-mean, the aggregation of its runs: under seq-mean-token-mean its agg_loss divides an answer
    with no selected token by 0 (NaN), and seq-mean-token-sum counts such answers in the mean; ours
    leaves answers without a selected token out of the policy-gradient term."""
    x = _inputs(seed)
    cfg = verl_loss_config(loss_agg, kl_coef=0.05, entropy_coef=0.01)
    ratio = 0.2
    reference_mask = get_global_entropy_top_mask(x["entropy"], x["mask"], ratio)
    reference_loss = verl_actor_loss(x, x["advantages"][:, None].expand_as(x["mask"]), x["mask"] * reference_mask, cfg)
    mask, loss = _ours(x, "ets-8020", ratio, cfg)
    assert torch.equal(mask, reference_mask.bool())
    assert abs(float(loss) - float(reference_loss)) < 1e-6


def ets_release_reference(x, ratio, cfg):
    # The GMTS release's verl fork, its ETS: top ⌈ρ·n⌉ entropy over the mini-batch's response tokens on the
    # rank; unselected tokens' advantage set to 0; verl's actor loss, denominators over response_mask.
    flat = x["entropy"][x["mask"].bool()]
    k = math.ceil(round(ratio * flat.numel(), 9))
    keep = torch.zeros(flat.numel(), dtype=torch.bool)
    keep[torch.topk(flat, k).indices] = True
    mask = torch.zeros_like(x["mask"], dtype=torch.bool)
    mask[x["mask"].bool()] = keep
    advantages = x["advantages"][:, None] * mask
    return mask, verl_actor_loss(x, advantages, x["mask"], cfg)


def gmts_release_scores(x, cfg):
    # The GMTS release's score: entropy × |1[not clipped] · r · A + β (π_ref/π − 1)|, no aggregation weight.
    ratio = torch.exp(x["logp"] - x["old_logp"])
    a = x["advantages"][:, None].expand_as(ratio)
    clipped = ((a > 0) & (ratio > 1 + cfg.clip_high)) | ((a < 0) & (ratio < 1 - cfg.clip_low))
    omega = (~clipped) * ratio * a + cfg.kl_coef * (torch.exp(x["ref_logp"] - x["logp"]) - 1)
    return (x["entropy"] * omega.abs() * x["mask"]).float()


def gmts_release_reference(x, ratio, cfg, group_size=4):
    # Per group of rollouts (every group: the release's loop reached only the first), top ⌈ρ·n⌉ of the
    # tokens with a non-zero score; advantage zeroed elsewhere; verl's actor loss.
    scores = gmts_release_scores(x, cfg)
    mask = torch.zeros_like(x["mask"], dtype=torch.bool)
    for start in range(0, scores.shape[0], group_size):
        block = scores[start : start + group_size]
        candidates = (block > 0).flatten().nonzero().squeeze(-1)
        k = math.ceil(round(ratio * candidates.numel(), 9))
        chosen = candidates[torch.topk(block.flatten()[candidates], k).indices]
        flat = torch.zeros(block.numel(), dtype=torch.bool)
        flat[chosen] = True
        mask[start : start + group_size] = flat.view_as(block)
    return mask, verl_actor_loss(x, x["advantages"][:, None] * mask, x["mask"], cfg)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("loss_agg", VERL_AGGS)
def test_ets_release_matches_the_release_code_path(seed, loss_agg):
    x = _inputs(seed)
    cfg = verl_loss_config(loss_agg, kl_coef=0.001)
    reference_mask, reference_loss = ets_release_reference(x, 0.2, cfg)
    mask, loss = _ours(x, "ets-release", 0.2, cfg)
    assert torch.equal(mask, reference_mask)
    assert abs(float(loss) - float(reference_loss)) < 1e-6


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("loss_agg", VERL_AGGS)
def test_gmts_release_matches_the_release_code_path(seed, loss_agg):
    x = _inputs(seed)
    x["advantages"][:4] = 0.0  # a group whose rewards all agree: no token is eligible, none selected
    cfg = verl_loss_config(loss_agg, kl_coef=0.0)
    reference_mask, reference_loss = gmts_release_reference(x, 0.2, cfg)
    mask, loss = _ours(x, "gmts-release", 0.2, cfg)
    assert torch.equal(mask, reference_mask) and not mask[:4].any()
    assert abs(float(loss) - float(reference_loss)) < 1e-6


@pytest.mark.parametrize("seed", range(3))
def test_gmts_paper_matches_eq_2(seed):
    """The GMTS paper's Eq. 2 as written: one threshold over the batch's tokens by H·|ω| (tokens of zero
    score cannot move the policy and are not counted), the clipped surrogate averaged over the selected
    tokens; here with the token-mean KL of every response token beside it."""
    x = _inputs(seed)
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0, loss_agg="token-mean")
    scores = gmts_release_scores(x, cfg)  # with β = 0 and token-mean the paper's ω ranks as the release's
    candidates = (scores > 0).flatten().nonzero().squeeze(-1)
    k = math.ceil(round(0.2 * candidates.numel(), 9))
    selected = torch.zeros(scores.numel(), dtype=torch.bool)
    selected[candidates[torch.topk(scores.flatten()[candidates], k).indices]] = True
    selected = selected.view_as(scores)
    ratio = torch.exp(x["logp"] - x["old_logp"])
    a = x["advantages"][:, None]
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high) * a)
    reference_loss = -(surrogate * selected).sum() / selected.sum()
    mask, loss = _ours(x, "gmts-paper", 0.2, cfg)
    assert torch.equal(mask, selected)
    assert abs(float(loss) - float(reference_loss)) < 1e-6


# ------------------------------------------------------------------------------------------------ TRL
def trl_get_high_entropy_mask(entropies, mask, threshold, gather=lambda t: t):
    # huggingface/trl, trl/trainer/grpo_trainer.py: GRPOTrainer.get_high_entropy_mask (pad, gather, drop pads)
    local = entropies[mask.bool()].float()
    gathered = gather(local)
    entropy_threshold = torch.quantile(gathered, threshold)
    return (entropies * mask.float() >= entropy_threshold) & mask.bool()


def trl_loss(x, entropy_mask, beta, loss_type, eps_low=0.2, eps_high=0.28, max_completion_length=12):
    # huggingface/trl, trl/trainer/grpo_trainer.py: GRPOTrainer._compute_loss
    per_token_kl = torch.exp(x["ref_logp"] - x["logp"]) - (x["ref_logp"] - x["logp"]) - 1
    coef_1 = torch.exp(x["logp"] - x["old_logp"])
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    a = x["advantages"][:, None]
    per_token_loss = -torch.min(coef_1 * a, coef_2 * a) * entropy_mask + beta * per_token_kl
    mask = x["mask"]
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    raise ValueError(loss_type)


TRL_AGGS = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("loss_type", sorted(TRL_AGGS))
@pytest.mark.parametrize("rho", [0.2, 0.35])
def test_ets_trl_matches_trl_top_entropy_quantile(seed, loss_type, rho):
    x = _inputs(seed)
    x["entropy"] = x["entropy"].float()  # as TRL's entropies (from float32 logits); the threshold is float32
    x["entropy"][1, :3] = x["entropy"][0, 0]  # a tie: TRL keeps every token at the threshold
    reference_mask = trl_get_high_entropy_mask(x["entropy"], x["mask"], 1 - rho)
    reference_loss = trl_loss(x, reference_mask, beta=0.04, loss_type=loss_type)
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.04, kl_estimator="k3", loss_agg=TRL_AGGS[loss_type],
                           loss_agg_norm_length=12)
    mask, loss = _ours(x, "ets-trl", rho, cfg)
    assert torch.equal(mask, reference_mask)
    assert abs(float(loss) - float(reference_loss)) < 1e-6


def _trl_worker(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x = _inputs(20 + rank, width=8 + 4 * rank)  # ranks hold different token counts
        x["entropy"] = x["entropy"].float()

        def gather(local):  # accelerator.pad_across_processes + gather, then drop the pad sentinel
            sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
            dist.all_gather(sizes, torch.tensor([local.numel()]))
            padded = torch.full((int(max(sizes)),), -1e9)
            padded[: local.numel()] = local
            parts = [torch.zeros_like(padded) for _ in range(world)]
            dist.all_gather(parts, padded)
            gathered = torch.cat(parts)
            return gathered[gathered != -1e9]

        reference = trl_get_high_entropy_mask(x["entropy"], x["mask"], 0.8, gather)
        ours = select_tokens(response_mask=x["mask"], entropy=x["entropy"], advantages=x["advantages"],
                             group_ids=x["group_ids"], config=SelectionConfig(recipe="ets-trl", ratio=0.2)).mask
        results[rank] = bool(torch.equal(reference, ours)), int(ours.sum())
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # a gloo process group of real ranks
def test_ets_trl_threshold_spans_every_rank():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_trl_worker, args=(2, port, results), nprocs=2, join=True)
    assert results[0][0] and results[1][0]
    assert results[0][1] != results[1][1]  # one threshold, so each rank keeps its own share


def test_every_recipe_has_a_reference_test():
    tested = {"ets-8020", "ets-trl", "ets-release", "gmts-release", "gmts-paper"}
    assert set(RECIPES) == tested
