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


def test_a_newly_registered_method_gets_its_partner_colour_and_row_from_its_facts_alone():
    """Who a method is compared with, its colour and its row come from its registration, not from lists in sweeps/:
    registering one (here with ``random`` as its partner) is all a report needs."""
    from sweeps.ablation import method_rank
    from sweeps.labels import method_color
    from workers.learner.selection import SELECTION_METHODS, register_selection_method

    assert "report_probe" not in SELECTION_METHODS
    register_selection_method("report_probe", compared_with="random", color="#123456")(lambda x: x.entropy)
    try:
        runs = SweepRuns(parent_run_id="p", experiment_id="0", sweep_id="s", spec_name="x", unfinished=[], trials=[
            _trial("a", "none", 0.30), _trial("b", "random", 0.25, "group", "all"),
            _trial("c", "report_probe", 0.40, "group", "all"), _trial("d", "ets", 0.35, "group", "all")])
        cells = {c.method: c for c in ablation(runs).cells}
        assert cells["report_probe"].delta_vs_ets == pytest.approx(0.15)  # against random, its registered partner
        assert cells["ets"].delta_vs_ets is None and cells["random"].delta_vs_ets is None  # no partner of their own
        assert method_color("report_probe") == "#123456"
        ranked = sorted(cells, key=method_rank)
        assert ranked[0] == "none" and ranked[-1] == "report_probe"  # registered last, shown last
    finally:
        del SELECTION_METHODS["report_probe"]


def test_plain_methods_and_recipes_keep_their_published_partners():
    from workers.learner.methods import comparison_partner
    from workers.learner.recipes import RECIPES

    assert comparison_partner("gmts-release") == comparison_partner("gmts-paper") == "ets-release"
    assert comparison_partner("gmts") == comparison_partner("gmts_exact") == "ets"
    assert comparison_partner("ets") is None and comparison_partner("none") is None
    assert all(comparison_partner(name) in (None, *RECIPES) for name in RECIPES)  # a recipe pairs with a recipe
