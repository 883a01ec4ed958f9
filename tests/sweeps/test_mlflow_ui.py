"""The MLflow UI, in a real headless Chromium, shows what a sweep's end promises: the parent run's summary
metrics and ablation table, the compare view of its trials, and an arm's completions table (``sweeps.ui_check``).

Real ``mlflow ui`` on loopback over a real SQLite store; the store's trials are logged by MlflowClient the
way ``orchestrator.train`` logs them (no training: the UI only reads the store), then reported by the real
``build_report``. Needs Debian's ``chromium``; without it the test is skipped, saying so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from orchestrator.completion_table import COLUMNS, artifact_file
from orchestrator.run_tracking import log_table
from sweeps.labels import trial_label
from sweeps.parent_run import PARENT_TAG, SPEC_NAME_TAG, SWEEP_ID_TAG, TRIAL_TAG, ensure_experiment
from sweeps.report import build_report
from sweeps.ui_check import check_sweep

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")]

FINALS = {("none", None, 0): 0.30, ("none", None, 1): 0.34, ("ets-release", 0.2, 0): 0.32,
          ("ets-release", 0.2, 1): 0.36, ("gmts-release", 0.2, 0): 0.40, ("gmts-release", 0.2, 1): 0.42}
COMPLETION = "Adding the ones column gives"  # every shown completion starts so: the page must show it


def _store(tmp_path: Path) -> tuple[str, str]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = ensure_experiment(client, "ui", tmp_path / "mlartifacts")
    parent = client.create_run(experiment_id, run_name="ui-sweep", tags={SWEEP_ID_TAG: "ui-sweep", SPEC_NAME_TAG: "ui"})
    for index, ((method, ratio, seed), final) in enumerate(FINALS.items()):
        point = {"method": method, "seed": seed} | ({"ratio": ratio, "mode": "top"} if ratio else {})
        run = client.create_run(experiment_id, run_name=trial_label(point),
                                tags={PARENT_TAG: parent.info.run_id, TRIAL_TAG: f"ui-t{index:03d}"})
        params = {"method": method, "model_size": "tiny-s", "algorithm": "grpo", "seed": str(seed)}
        params |= {"ratio": str(ratio), "mode": "top"} if ratio else {}
        metrics = [Metric("eval/arithmetic/accuracy", 0.2 + (final - 0.2) * step / 4, 0, step) for step in range(5)]
        metrics.append(Metric("base/arithmetic/accuracy", 0.2, 0, 0))
        client.log_batch(run.info.run_id, metrics=metrics, params=[Param(k, v) for k, v in params.items()])
        for step in (0, 4):
            rows = [{"prompt": f"2048+{2048 + i + seed}=", "completion": f"{COMPLETION} {4096 + i + seed}",
                     "answer": str(4096 + i + seed), "reference": str(4096 + i + seed), "reward": 1.0,
                     "problem_id": f"add-{i}", "index": i, "step": step, "set": "arithmetic"} for i in range(3)]
            log_table(client, run.info.run_id, artifact_file("arithmetic", step), COLUMNS,
                      [[row[c] for c in COLUMNS] for row in rows], pinned=step == 0)
        client.set_terminated(run.info.run_id)
    client.set_terminated(parent.info.run_id)
    build_report(client, client.get_run(parent.info.run_id), tmp_path / "report")
    return uri, parent.info.run_id


def test_parent_run_and_compare_view_show_the_answer(tmp_path: Path) -> None:
    uri, parent_id = _store(tmp_path)
    checks = check_sweep(uri, parent_id, tmp_path / "shots")
    parent_page, compare_page, completions_page = checks
    assert "accuracy/arithmetic/gmts-release_top0.2/mean" in parent_page.expected
    assert any("Δ" in text for text in parent_page.expected)  # the table's GMTS row, Δ over ETS included
    assert parent_page.missing == [], parent_page.url
    assert "GMTS-release top-20 % · seed 1" in compare_page.expected
    assert compare_page.missing == [], compare_page.url
    # The report's first arm link opens the table in the artifact view: its first completion and reference show.
    assert "/artifacts/completions/arithmetic/step_000004.json" in completions_page.url
    assert completions_page.expected == [f"{COMPLETION} 4096", "4096"]
    assert completions_page.missing == [], completions_page.url
    for check in checks:
        assert check.screenshot is not None and check.screenshot.stat().st_size > 10_000
