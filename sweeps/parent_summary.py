"""The parent run answers the sweep's question in the MLflow runs table and on its own page.

- Metrics: per arm and test benchmark, the final eval metric's mean over seeds, its 95 % t interval, the
  number of seeds, and for a GMTS arm Δ = GMTS − ETS paired by seed with its interval: exactly the numbers
  of the ablation cells (:mod:`sweeps.ablation`, :mod:`sweeps.statistics`), never recomputed here.
  Keys: ``<metric>/<benchmark>/<arm>/<statistic>``, e.g. ``accuracy/arithmetic/gmts-release_top0.2/mean``
  (``mean``, ``ci_low``, ``ci_high``, ``n``, ``delta_vs_ets``, ``delta_ci_low``, ``delta_ci_high``).
- Description (``mlflow.note.content``, on the run's page): the ablation table in Markdown, then the
  spec's description.
- Links: the parent run, the compare view of its children (what the sweep's end prints), and a run's
  artifact (the completions tables, :mod:`sweeps.completions`).
"""

from __future__ import annotations

import json
import time
from urllib.parse import quote

from mlflow import MlflowClient
from mlflow.entities import Metric

from sweeps.ablation import BASE, AblationResults, Cell
from sweeps.labels import arm_key

NOTE_TAG = "mlflow.note.content"
# `mlflow ui`'s default address; a tracking server's own URL is used when the store is one.
LOCAL_UI = "http://127.0.0.1:5000"
# MLflow ≥ 3 opens in its GenAI view unless told; this query parameter opens the "Model training" one.
TRAINING_VIEW = "workflowType=machine_learning"


def summary_metrics(results: AblationResults, metric: str = "accuracy") -> dict[str, float]:
    """The parent's metrics (see the module docstring): each arm at its chosen lr, test benchmarks only."""
    cells = [c for c in results.cells if c.metric == metric and c.split == "test" and c.selected]
    several_sections = len({(c.model_size, c.algorithm) for c in cells}) > 1
    several_populations = len({(c.method, c.scope, c.denominator) for c in cells if c.method != BASE}) > len(
        {c.method for c in cells if c.method != BASE})
    out: dict[str, float] = {}
    for cell in cells:
        arm = _arm(cell, with_section=several_sections, with_population=several_populations)
        prefix = f"{metric}/{cell.benchmark}/{arm}"
        stats = {"mean": cell.mean, "ci_low": cell.ci_low, "ci_high": cell.ci_high, "n": float(cell.n),
                 "delta_vs_ets": cell.delta_vs_ets, "delta_ci_low": cell.delta_ci_low,
                 "delta_ci_high": cell.delta_ci_high}
        out.update({f"{prefix}/{name}": value for name, value in stats.items() if value is not None})
    return out


def _arm(cell: Cell, *, with_section: bool, with_population: bool) -> str:
    if cell.method == BASE:
        return arm_key(BASE, model_size=cell.model_size if with_section else None,
                       algorithm=cell.algorithm if with_section else None)
    return arm_key(cell.method, cell.mode, cell.ratio,
                   scope=cell.scope if with_population else None,
                   denominator=cell.denominator if with_population else None,
                   model_size=cell.model_size if with_section else None,
                   algorithm=cell.algorithm if with_section else None)


def log_summary(client: MlflowClient, parent_run_id: str, results: AblationResults, note: str, *,
                metric: str = "accuracy") -> dict[str, float]:
    """Log the summary metrics and the description (``table_views.to_note``) on the parent run; returns
    the metrics."""
    metrics = summary_metrics(results, metric)
    now = int(time.time() * 1000)
    batch = [Metric(key, value, now, 0) for key, value in sorted(metrics.items())]
    for start in range(0, len(batch), 900):  # MLflow caps a batch at 1000 metrics
        client.log_batch(parent_run_id, metrics=batch[start:start + 900])
    client.set_tag(parent_run_id, NOTE_TAG, note)
    return metrics


def ui_base(tracking_uri: str) -> str:
    """The UI's address: the tracking server itself, else what ``mlflow ui`` serves by default."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return LOCAL_UI


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"


def artifact_url(tracking_uri: str, experiment_id: str, run_id: str, path: str) -> str:
    """The run's page opened on one artifact (the UI's ``/runs/<run>/artifacts/<path>`` route)."""
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}/artifacts/{quote(path)}?{TRAINING_VIEW}"


def compare_url(tracking_uri: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare view of ``run_ids`` (its own route: ``/compare-runs?runs=[…]&experiments=[…]``)."""
    runs = quote(json.dumps(run_ids, separators=(",", ":")))
    experiments = quote(json.dumps([experiment_id], separators=(",", ":")))
    return f"{ui_base(tracking_uri)}/#/compare-runs?runs={runs}&experiments={experiments}&{TRAINING_VIEW}"
