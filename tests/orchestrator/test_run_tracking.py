"""What a trial's MLflow run holds: params that mean something for its method, and its datasets.

Real MLflow (a SQLite store in a temporary folder), real configs from the shipped preset."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from orchestrator.config_loader import load_experiment
from orchestrator.data import load_dataset
from orchestrator.run_tracking import RunTracker, grid_params, run_params


def _config(tmp_path: Path, *overrides: str):
    return load_experiment("cpu-tiny-s", [f"output_dir={tmp_path}", f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db",
                                          *overrides])


def test_the_full_token_baseline_has_no_selection_params(tmp_path: Path) -> None:
    config = _config(tmp_path, "selection.recipe=null", "selection.method=none", "selection.ratio=null")
    params = run_params(config)
    assert params["method"] == "none"
    assert not {"ratio", "mode", "scope", "denominator", "recipe"} & set(params)
    assert [k for k in params if k.startswith("selection.")] == ["selection.method"]
    assert "name" not in params  # the trial id is a tag (gmts.run_name), not a param


def test_a_recipe_run_names_its_recipe_and_population(tmp_path: Path) -> None:
    config = _config(tmp_path, "selection.recipe=gmts-release", "selection.method=gmts", "selection.scope=group",
                     "selection.apply_to=advantage", "selection.omega_aggregation_weight=false", "selection.ratio=0.2")
    params = grid_params(config)
    assert (params["method"], params["recipe"], params["ratio"], params["mode"]) == ("gmts-release", "gmts-release",
                                                                                     "0.2", "top")
    assert (params["scope"], params["denominator"]) == ("group", "all")
    plain = grid_params(_config(tmp_path, "selection.recipe=null", "selection.method=ets", "selection.ratio=0.2"))
    assert "recipe" not in plain and plain["method"] == "ets"


def test_a_token_method_run_records_its_ratio_scope_and_own_settings(tmp_path: Path) -> None:
    """clip_cov / archer choose tokens with a select, not a score: their settings are a run's params all the same."""
    config = _config(tmp_path, "selection.recipe=null", "selection.method=archer", "selection.scope=response",
                     "selection.ratio=0.2")
    params = run_params(config)
    assert (params["method"], params["ratio"], params["scope"]) == ("archer", "0.2", "response")
    assert params["selection.archer.high_entropy_clip"] == "0.5"
    clip_cov = run_params(_config(tmp_path, "selection.recipe=null", "selection.method=clip_cov",
                                  "selection.scope=micro_batch", "selection.ratio=0.0002"))
    assert (clip_cov["ratio"], clip_cov["selection.covariance.ratio_clip"]) == ("0.0002", "1.0")


@pytest.mark.slow
def test_datasets_fill_the_runs_datasets(tmp_path: Path) -> None:
    config = _config(tmp_path)
    tracker = RunTracker(config)
    train = load_dataset(config.data.train)
    evaluation = {name: load_dataset(spec) for name, spec in config.data.eval.items()}
    tracker.log_datasets(("arithmetic-train", train), evaluation)
    tracker.finish()
    run = MlflowClient(config.tracking_uri()).get_run(tracker.run_id)
    logged = {d.dataset.name: ({t.key: t.value for t in d.tags}["mlflow.data.context"], d.dataset)
              for d in run.inputs.dataset_inputs}
    assert set(logged) == {"arithmetic-train", *evaluation}
    assert logged["arithmetic-train"][0] == "training"
    assert all(logged[name][0] == "evaluation" for name in evaluation)
    assert str(len(train)) in logged["arithmetic-train"][1].profile  # its row count
    # Same problems, same digest: a second run on them shows the same dataset.
    again = RunTracker(config)
    again.log_datasets(("arithmetic-train", train), {})
    again.finish()
    second = MlflowClient(config.tracking_uri()).get_run(again.run_id).inputs.dataset_inputs[0].dataset
    assert second.digest == logged["arithmetic-train"][1].digest
