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


def test_a_method_whose_ratio_is_not_the_kept_share_gets_one_row_with_its_ratio_in_the_label():
    def trial(name, method, ratio, accuracy):
        point = TrialPoint(method=method, ratio=ratio, mode=None if ratio is None else "top", model_size="tiny-s",
                           algorithm="grpo", seed=0)
        return TrialRecord(run_id=name, name=name, status="FINISHED", point=point,
                           final={"eval/arithmetic/accuracy": accuracy})

    runs = SweepRuns(parent_run_id="p", experiment_id="0", sweep_id="s", spec_name="x", unfinished=[], trials=[
        trial("a", "none", None, 0.30), trial("b", "gmts", 0.2, 0.45), trial("c", "ets", 0.5, 0.40),
        trial("d", "clip_cov", 0.0002, 0.31), trial("e", "kl_cov", 0.002, 0.33), trial("f", "entropy_adv", None, 0.35)])
    (table,) = wide_tables(ablation(runs))
    assert [ratio for ratio, _ in table.columns] == ["0.2", "0.5"]  # kept shares only, not 0.0002 / 0.002
    rows = {label: (mode, texts) for label, mode, texts in table.rows}
    # Like the full-token baseline: under every ratio column, mode "—", its own ρ in the label.
    assert rows["clip_cov ρ=0.0002"] == ("—", ["31.0", "31.0"])
    assert rows["kl_cov ρ=0.002"] == ("—", ["33.0", "33.0"])
    assert rows["entropy_adv"] == ("—", ["35.0", "35.0"])
    assert rows["gmts"][1][0].startswith("45.0") and rows["ets"][1][1] == "40.0"
