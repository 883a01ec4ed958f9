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
