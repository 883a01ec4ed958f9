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
