"""Names a person reads come from the selection-method registry and the recipes, not from a list of our own."""

from __future__ import annotations

import pytest

from sweeps.labels import arm_key, method_color, method_display, trial_label
from sweeps.spec import SweepSpec, expand
from workers.learner.recipes import RECIPES
from workers.learner.selection import SELECTION_METHODS, register_selection_method


def test_display_names_of_methods_and_recipes() -> None:
    assert method_display("none") == "All tokens"  # the registered method with no score
    assert method_display("ets") == "ETS"
    assert method_display("gmts_exact") == "GMTS_EXACT"
    assert method_display("gmts-release") == "GMTS-release"
    assert method_display("ets-8020") == "ETS-8020"
    assert method_display("clip_cov") == "Clip-Cov" and method_display("archer") == "Archer"  # display_name facts
    # ρ of a token method is a setting of its own, not a kept share: no "top-…" in its name
    assert trial_label({"method": "clip_cov", "ratio": 0.0002, "scope": "micro_batch", "seed": 0}) == \
        "Clip-Cov ρ=0.0002 · micro_batch · seed 0"
    # Only the method that neither scores nor selects reads "All tokens" (the zoo's methods select their own)
    assert [name for name in SELECTION_METHODS if method_display(name) == "All tokens"] == ["none"]
    for recipe in RECIPES:  # every recipe reads as its method's name first
        assert method_display(recipe).startswith(method_display(RECIPES[recipe].fields["method"]))


def test_a_newly_registered_method_is_named_without_editing_the_labels() -> None:
    assert "label_probe" not in SELECTION_METHODS
    register_selection_method("label_probe")(lambda x: x.entropy)
    try:
        assert trial_label({"method": "label_probe", "ratio": 0.1, "mode": "bottom", "seed": 3}) == \
            "LABEL_PROBE bottom-10 % · seed 3"
        assert method_color("label_probe") == method_color("label_probe") and method_color("label_probe").startswith("#")
    finally:
        del SELECTION_METHODS["label_probe"]


@pytest.mark.parametrize(("point", "label"), [
    ({"method": "gmts-release", "ratio": 0.2, "mode": "top", "seed": 0}, "GMTS-release top-20 % · seed 0"),
    ({"method": "none", "seed": 1}, "All tokens · seed 1"),
    ({"method": "ets", "ratio": 0.5, "mode": "top", "scope": "group", "denominator": "selected", "lr": 1e-5,
      "seed": 0}, "ETS top-50 % · group ÷selected · lr 1e-05 · seed 0"),
    ({"method": "gmts", "ratio": 0.2, "mode": "top", "model_size": "cpu-tiny-m", "algorithm": "dapo"},
     "GMTS top-20 % · cpu-tiny-m · dapo"),
])
def test_trial_labels_name_only_the_axes_of_the_point(point: dict, label: str) -> None:
    assert trial_label(point) == label


def test_metric_key_segments_are_mlflow_safe() -> None:
    assert arm_key("gmts-release", "top", 0.2) == "gmts-release_top0.2"
    assert arm_key("none") == "none"
    assert arm_key("ets", "top", 0.2, scope="global_micro_batch", denominator="all", lr=3e-6) == \
        "ets_top0.2_global_micro_batch_all_lr3e-06"


def test_child_runs_of_the_demo_grid_are_named_by_what_they_are() -> None:
    from sweeps.driver import nest_trials
    from sweeps.layout import SweepRecord

    spec = SweepSpec.model_validate({"name": "demo", "base": {"preset": "cpu-tiny-s"},
                                     "grid": {"method": ["none", "ets-release", "gmts-release"], "ratio": [0.2],
                                              "mode": ["top"], "seed": [0]}})
    record = SweepRecord.model_construct(sweep_id="demo-1", spec_name="demo", tracking_uri="sqlite:///x.db")
    trials = nest_trials(expand(spec), record, "parent")
    assert [t.config.tracking.run_name for t in trials] == [
        "All tokens · seed 0", "ETS-release top-20 % · seed 0", "GMTS-release top-20 % · seed 0"]
    colors = [t.config.tracking.tags["mlflow.runColor"] for t in trials]
    assert len(set(colors)) == 3
