import math

import pytest
import torch

from workers.learner.diagnostics import selection_diagnostics, within_answer_spearman
from workers.learner.selection import SelectionConfig, select_tokens


def test_spearman_is_one_for_monotone_and_minus_one_for_reversed():
    x = torch.tensor([[0.1, 0.5, 0.3, 0.9, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    assert within_answer_spearman(x, x ** 3, mask) == pytest.approx(1.0)
    assert within_answer_spearman(x, -x, mask) == pytest.approx(-1.0)
    assert math.isnan(within_answer_spearman(x, x, torch.tensor([[1, 1, 0, 0, 0]])))


def test_diagnostics_report_the_selection():
    g = torch.Generator().manual_seed(0)
    entropy = torch.rand(4, 6, generator=g)
    mask = torch.ones(4, 6)
    sel = select_tokens(response_mask=mask, entropy=entropy, advantages=torch.ones(4), group_ids=torch.zeros(4),
                        config=SelectionConfig(method="ets", ratio=0.25, scope="micro_batch"))
    metrics = selection_diagnostics(sel, mask, entropy, grad_norm=entropy * 2)
    assert metrics["selection/selected_fraction"] == pytest.approx(0.25)
    assert metrics["selection/entropy_selected"] > metrics["selection/entropy_all"]
    assert metrics["selection/spearman_entropy_gradnorm"] == pytest.approx(1.0)
    assert metrics["selection/pearson_log_entropy_log_gradnorm"] == pytest.approx(1.0)  # log G = log H + log 2
    assert metrics["selection/score_q10"] <= metrics["selection/score_q50"] <= metrics["selection/score_q90"]


def test_advantage_and_position_diagnostics_by_hand():
    from workers.learner.selection import Selection

    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]).bool()
    chosen = torch.tensor([[1, 0, 0, 1, 0], [0, 1, 0, 0, 0], [1, 1, 0, 0, 0]]).bool()
    advantages = torch.tensor([1.0, 0.0, -0.5])
    sel = Selection(mask=chosen, scores=chosen.float(), eligible=mask)
    entropy = torch.rand(3, 5)
    token_mean = selection_diagnostics(sel, mask, entropy, advantages=advantages)
    assert token_mean["selection/zero_advantage_share"] == pytest.approx(1 / 5)
    # token-mean weights are uniform: Σw·A / Σw·|A| = (1 + 1 − 0.5 − 0.5) / (1 + 1 + 0.5 + 0.5)
    assert token_mean["selection/net_signed_weight"] == pytest.approx(1 / 3)
    assert token_mean["selection/mean_abs_advantage"] == pytest.approx((1 + 1 + 0 + 0.5 + 0.5) / 5)
    # seq-mean-token-mean over all tokens: w = 1/|o_i|/3, so row 0 (4 tokens) weighs 1/4, row 2 (5 tokens) 1/5
    per_seq = selection_diagnostics(sel, mask, entropy, advantages=advantages, loss_agg="seq-mean-token-mean")
    assert per_seq["selection/net_signed_weight"] == pytest.approx((2 / 4 - 1 / 5) / (2 / 4 + 1 / 5))
    # Deciles: row 0 positions 0..3 → deciles 0, 2, 5, 7; row 1: 0, 5; row 2: 0, 2, 4, 6, 8.
    assert token_mean["selection/decile_0"] == pytest.approx(2 / 3)  # rows 0 and 2 chosen at 0, row 1 not
    assert token_mean["selection/decile_5"] == pytest.approx(1 / 2)  # row 1's second token yes, row 0's third no
    assert token_mean["selection/decile_7"] == pytest.approx(1.0) and math.isnan(token_mean["selection/decile_9"])


def test_within_answer_pearson_is_the_mean_of_scipy_per_answer():
    from scipy import stats

    from workers.learner.diagnostics import within_answer_pearson

    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(3, 7, generator=g, dtype=torch.float64), torch.rand(3, 7, generator=g, dtype=torch.float64)
    lengths = [7, 5, 2]  # the last answer has too few tokens to count
    mask = torch.arange(7)[None] < torch.tensor(lengths)[:, None]
    x[1, 5:] = float("nan")  # padding may hold anything
    expected = (stats.pearsonr(x[0], y[0]).statistic + stats.pearsonr(x[1, :5], y[1, :5]).statistic) / 2
    assert within_answer_pearson(x, y, mask) == pytest.approx(expected, abs=1e-12)
    constant = torch.ones(1, 4, dtype=torch.float64)
    assert math.isnan(within_answer_pearson(constant, torch.rand(1, 4, dtype=torch.float64), torch.ones(1, 4)))


def test_log_log_pearson_by_hand_skips_tokens_without_a_logarithm():
    import numpy as np

    from workers.learner.diagnostics import log_entropy_gradnorm_pearson

    entropy = torch.tensor([[0.1, 0.4, 0.9, 1.6, 0.0], [2.0, 0.5, 1.0, 3.0, 0.7]])
    grad_norm = torch.tensor([[0.2, 0.5, 0.6, 0.9, 0.0], [0.8, 0.1, 0.3, 0.0, 0.4]])
    mask = torch.ones(2, 5)
    # Row 0: (H, G) = 0 is left out; row 1: G = 0 at column 3 is left out.
    keep = [[0, 1, 2, 3], [0, 1, 2, 4]]
    by_hand = [np.corrcoef(np.log(entropy[r, k].double().numpy()), np.log(grad_norm[r, k].double().numpy()))[0, 1]
               for r, k in enumerate(keep)]
    assert log_entropy_gradnorm_pearson(entropy, grad_norm, mask) == pytest.approx(float(np.mean(by_hand)), abs=1e-6)
    # A power law G = c·H^k is a straight line on log–log axes: r = 1 whatever c and k.
    h = torch.tensor([[0.01, 0.1, 0.5, 2.0]])
    assert log_entropy_gradnorm_pearson(h, 0.3 * h ** 0.25, torch.ones(1, 4)) == pytest.approx(1.0, abs=1e-9)


def test_gmts_score_spearman_pools_each_group_and_drops_zero_omega():
    from scipy import stats

    from workers.learner.diagnostics import gmts_score_spearman

    g = torch.Generator().manual_seed(5)
    entropy, grad_norm = torch.rand(4, 5, generator=g), torch.rand(4, 5, generator=g)
    omega = torch.tensor([0.5, -1.0, 0.25, 0.0])[:, None].expand(4, 5).clone()  # answer 3: A = 0
    omega[2, 4] = 0.0
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]).bool()
    group_ids = torch.tensor([7, 7, 9, 9])
    per_group = []
    for rows in ([0, 1], [2, 3]):
        keep = mask[rows] & (omega[rows] != 0)
        score = (entropy[rows] * omega[rows].abs())[keep].double()
        true_norm = (grad_norm[rows] * omega[rows].abs())[keep].double()
        per_group.append(stats.spearmanr(score, true_norm).statistic)
    value = gmts_score_spearman(entropy, grad_norm, omega, mask, group_ids)
    assert value == pytest.approx(sum(per_group) / 2, abs=1e-12)
    # Within one answer |ω| is one number: the score ranks its tokens exactly as H ranks G.
    single = gmts_score_spearman(entropy[:1], grad_norm[:1], omega[:1], mask[:1], group_ids[:1])
    assert single == pytest.approx(within_answer_spearman(entropy[:1], grad_norm[:1], mask[:1]), abs=1e-12)
    assert math.isnan(gmts_score_spearman(entropy, grad_norm, torch.zeros(4, 5), mask, group_ids))


def test_gmts_and_entropy_times_advantage_rank_alike_on_policy_and_apart_off_policy():
    from scipy import stats

    from workers.learner.diagnostics import omega_vs_advantage_ranking
    from workers.learner.losses import PolicyLossConfig, effective_grad_coef

    g = torch.Generator().manual_seed(11)
    entropy = torch.rand(4, 6, generator=g)
    advantages = torch.tensor([1.0, -0.5, 0.8, -1.2])
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0], [1] * 6]).float()
    group_ids = torch.tensor([0, 0, 1, 1])
    logp = -torch.rand(4, 6, generator=g) * 3
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.2)
    per_token = advantages[:, None].expand(4, 6)
    on_policy = effective_grad_coef(logp, logp, per_token, mask, config, include_aggregation_weight=False)
    same = omega_vs_advantage_ranking(entropy, on_policy, advantages, mask, group_ids, ratio=0.3)
    assert same == {"selection/gmts_vs_h_abs_a_spearman": pytest.approx(1.0),
                    "selection/gmts_vs_h_abs_a_overlap": 1.0}
    # A lagging sampler: ratios away from 1 reweight tokens, clipped ones drop to 0.
    old_logp = logp + torch.randn(4, 6, generator=g) * 0.4
    off_policy = effective_grad_coef(logp, old_logp, per_token, mask, config, include_aggregation_weight=False)
    apart = omega_vs_advantage_ranking(entropy, off_policy, advantages, mask, group_ids, ratio=0.3)
    rhos, kept, together = [], 0, 0
    for rows in ([0, 1], [2, 3]):
        members = mask[rows].bool()
        gmts = (entropy[rows] * off_policy[rows].abs())[members].double()
        plain = (entropy[rows] * advantages[rows][:, None].abs().expand(2, 6))[members].double()
        rhos.append(stats.spearmanr(gmts, plain).statistic)
        k = math.ceil(0.3 * len(gmts))
        together += len(set(torch.topk(gmts, k).indices.tolist()) & set(torch.topk(plain, k).indices.tolist()))
        kept += k
    assert apart["selection/gmts_vs_h_abs_a_spearman"] == pytest.approx(sum(rhos) / 2, abs=1e-9)
    assert apart["selection/gmts_vs_h_abs_a_overlap"] == together / kept < 1.0


def test_ranking_pools_interleaved_groups_and_averages_ties_like_scipy():
    """The learner's batch rows need not hold a group side by side, and clipped tokens (ω = 0) tie: each group's
    tokens, pooled in row order, ranked with ties averaged (scipy's rankdata), kept by a stable order."""
    from scipy import stats

    from workers.learner.diagnostics import omega_vs_advantage_ranking

    g = torch.Generator().manual_seed(5)
    entropy = torch.randint(1, 4, (9, 7), generator=g).double() / 4  # few levels: ties in both scores
    omega = torch.randint(-2, 3, (9, 7), generator=g).double()
    advantages = torch.tensor([1.0, -1.0, 0.5, 1.0, -0.5, 0.5, 2.0, -2.0, 1.0])
    mask = torch.rand(9, 7, generator=g) > 0.3
    group_ids = torch.tensor([7, 3, 7, 5, 3, 7, 5, 3, 5])
    out = omega_vs_advantage_ranking(entropy, omega, advantages, mask, group_ids, ratio=0.25)
    rhos, kept, together = [], 0, 0
    for group in (3, 5, 7):
        members = mask & (group_ids == group)[:, None]
        gmts = (entropy * omega.abs())[members]
        plain = (entropy * advantages[:, None].abs().expand(9, 7))[members]
        rhos.append(stats.spearmanr(gmts, plain).statistic)
        k = max(1, math.ceil(0.25 * len(gmts)))
        top = lambda score: set(sorted(range(len(score)), key=lambda i: -float(score[i]))[:k])  # sorted() is stable
        together += len(top(gmts) & top(plain))
        kept += k
    assert out["selection/gmts_vs_h_abs_a_spearman"] == pytest.approx(sum(rhos) / 3, abs=1e-12)
    assert out["selection/gmts_vs_h_abs_a_overlap"] == together / kept


def _roles_example():
    """Three answers: two labelled (o f c d a x → 0 … 5, decisions c and d), one of a task without roles."""
    from workers.learner.batch import NO_ROLE, RoleLegend

    legend = RoleLegend(names=("o", "f", "c", "d", "a", "x"), decisions=frozenset({2, 3}))
    o, f, c, d, a, _ = range(6)
    n = NO_ROLE
    roles = torch.tensor([[o, f, o, c, d], [d, d, a, f, n], [n, n, n, n, n]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool()
    chosen = torch.tensor([[0, 0, 1, 1, 1], [1, 0, 0, 1, 1], [1, 1, 1, 1, 1]]).bool()  # row 1's pad is off the mask
    return legend, roles, mask, chosen


def test_role_diagnostics_by_hand():
    from workers.learner.diagnostics import role_diagnostics

    legend, roles, mask, chosen = _roles_example()
    metrics = role_diagnostics(chosen & mask, mask, roles, legend)
    # Selected with a role: row 0's o, c, d and row 1's d, f (row 2 has no roles): 5 tokens, 3 decisions.
    assert metrics["selection/decision_share"] == pytest.approx(3 / 5)
    assert metrics["selection/decision_base_share"] == pytest.approx(4 / 9)  # c, d, d, d of 9 labelled tokens
    expected_share = {"o": 1 / 5, "f": 1 / 5, "c": 1 / 5, "d": 2 / 5, "a": 0.0, "x": 0.0}
    for role, share in expected_share.items():
        assert metrics[f"selection/role_share/{role}"] == pytest.approx(share)
    expected_rate = {"o": 1 / 2, "f": 1 / 2, "c": 1.0, "d": 2 / 3, "a": 0.0}
    for role, rate in expected_rate.items():
        assert metrics[f"selection/role_rate/{role}"] == pytest.approx(rate)
    assert math.isnan(metrics["selection/role_rate/x"])  # no token plays it
    # Deciles ⌊10 j / n⌋: row 0 (n = 5) → 0, 2, 4, 6, 8; row 1 (n = 4) → 0, 2, 5, 7.
    # Selected: row 0's o@4, c@6, d@8; row 1's d@0, f@7.
    by_decile = {0: 1.0, 4: 0.0, 6: 1.0, 7: 0.0, 8: 1.0}
    for decile in range(10):
        value = metrics[f"selection/decision_share_decile_{decile}"]
        if decile in by_decile:
            assert value == pytest.approx(by_decile[decile])
        else:
            assert math.isnan(value)


def test_keeping_every_token_measures_the_base_rates():
    legend, roles, mask, _ = _roles_example()
    entropy = torch.rand(3, 5, generator=torch.Generator().manual_seed(1))
    sel = select_tokens(response_mask=mask.float(), entropy=entropy, advantages=torch.ones(3),
                        group_ids=torch.zeros(3), config=SelectionConfig(method="none"))
    metrics = selection_diagnostics(sel, mask.float(), entropy, token_roles=roles, role_legend=legend)
    assert metrics["selection/decision_share"] == pytest.approx(metrics["selection/decision_base_share"])
    assert metrics["selection/decision_base_share"] == pytest.approx(4 / 9)
    assert all(metrics[f"selection/role_rate/{role}"] == 1.0 for role in "ofcda")
    assert not any(key.startswith("selection/role") for key in selection_diagnostics(sel, mask.float(), entropy))
