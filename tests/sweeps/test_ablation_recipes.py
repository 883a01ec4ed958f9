"""Recipes and matched-scope pairs in the ablation cells and tables."""

import pytest

from sweeps.ablation import ablation
from sweeps.results import SweepRuns, TrialPoint, TrialRecord
from sweeps.table_views import to_markdown, wide_tables


def _trial(name, method, accuracy, scope=None, denominator=None):
    point = TrialPoint(method=method, ratio=None if method == "none" else 0.2, mode=None if method == "none" else "top",
                       scope=scope, denominator=denominator, model_size="tiny-s", algorithm="grpo", seed=0)
    return TrialRecord(run_id=name, name=name, status="FINISHED", point=point,
                       final={"eval/arithmetic/accuracy": accuracy})


def test_recipes_compare_with_their_partner_and_plain_methods_at_the_same_scope():
    runs = SweepRuns(parent_run_id="p", experiment_id="0", sweep_id="s", spec_name="x", unfinished=[], trials=[
        _trial("a", "none", 0.30),
        _trial("b", "ets-release", 0.40, "mini_batch", "all"),
        _trial("c", "gmts-release", 0.45, "group", "all"),
        _trial("d", "ets", 0.35, "group", "all"),
        _trial("e", "gmts", 0.50, "group", "all"),
        _trial("f", "ets", 0.20, "micro_batch", "selected"),
    ])
    cells = {(c.method, c.scope): c for c in ablation(runs).cells}
    assert cells[("gmts-release", "group")].delta_vs_ets == pytest.approx(0.05)  # vs ets-release (another scope)
    assert cells[("gmts", "group")].delta_vs_ets == pytest.approx(0.15)  # vs plain ets at group, ÷all only
    markdown = to_markdown(ablation(runs), wide_tables(ablation(runs)))
    assert "| ets-release [mini_batch, ÷all] | top |" in markdown
    assert "| gmts [group, ÷all] | top | 50.0 (Δ +15.0) |" in markdown
    assert "| none | — | 30.0 |" in markdown
