"""One MLflow run per training run, safe to resume without logging a step twice.

Metrics are buffered and written when the run checkpoints (and at the end): a crash loses the
unflushed steps, and the resumed run — which restarts from that same checkpoint and reopens the
same MLflow run — logs them exactly once. Without checkpointing every step is written at once.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlflow.data.code_dataset_source import CodeDatasetSource
from mlflow.entities import DatasetInput, InputTag, Metric, Param, RunStatus
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_LOGGED_ARTIFACTS
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH
from mlflow.tracking import MlflowClient

from orchestrator.config import ExperimentConfig, flatten
from workers.learner.selection import SELECTION_METHODS
from workers.problem import Problem

logger = logging.getLogger(__name__)

# MLflow rejects params longer than this; longer values are cut (the full config is an artifact).
MAX_PARAM_CHARS = 6000


def grid_params(config: ExperimentConfig) -> dict[str, str]:
    """The short, stable names a sweep's ablation grid is compared by in the MLflow UI.

    Only what means something for the run's method: the full-token baseline (a method with neither a score nor a select) has
    no ratio, mode, scope or denominator, and ``recipe`` appears only when the run follows one.
    """
    selection = config.selection
    params = {
        "method": selection.label,  # a reference recipe's name (ets-release), else the method
        "model_size": config.model.size_label,
        "algorithm": config.algorithm.name,
        "seed": str(config.training.seed),
    }
    if selection.recipe:
        params["recipe"] = selection.recipe
    if _selects(config):
        params.update(ratio=str(selection.ratio), mode=selection.mode, scope=selection.scope,
                      denominator=selection.denominator)
    return params


def run_params(config: ExperimentConfig) -> dict[str, str]:
    """Every config field as a param (the full config is also an artifact), less what means nothing here:
    the run's own name (a trial id, already the ``gmts.run_name`` tag) and, for the full-token baseline,
    the selection fields other than its method."""
    params = flatten(config)
    params.pop("name", None)
    if not _selects(config):
        params = {k: v for k, v in params.items() if not k.startswith("selection.") or k == "selection.method"}
    return {**params, **grid_params(config)}


def _selects(config: ExperimentConfig) -> bool:
    """Every method but the full-token baseline: the ranked ones (a score) and the token methods (a select,
    e.g. clip_cov, archer), whose ratio, scope and own settings a run must record too."""
    method = SELECTION_METHODS.get(config.selection.method)
    return method is not None and (method.score is not None or method.select is not None)


def _dataset_input(name: str, problems: list[Problem], *, context: str) -> DatasetInput:
    import pandas as pd  # only this needs it (MLflow depends on pandas)
    from mlflow.data.pandas_dataset import from_pandas

    frame = pd.DataFrame([{"id": p.id, "prompt": p.prompt, "answer": p.answer, "domain": p.domain} for p in problems],
                         columns=["id", "prompt", "answer", "domain"])
    dataset = from_pandas(frame, source=CodeDatasetSource({"gmts.data": name}), targets="answer", name=name)
    return DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])


class RunTracker:
    def __init__(self, config: ExperimentConfig, run_id: str | None = None) -> None:
        self.config = config
        self.uri = config.tracking_uri()
        if self.uri.startswith("sqlite:///"):
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(self.uri)
        self._pending: list[Metric] = []
        self.run_id = run_id or self._create_run()

    def _create_run(self) -> str:
        tracking = self.config.tracking
        experiment = self.client.get_experiment_by_name(tracking.experiment)
        # MLflow ≥ 3 shows an experiment of this kind in its "Model training" view (the tag sweeps set too).
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
            tracking.experiment, tags={"mlflow.experimentKind": "custom_model_development"})
        tags = {"mlflow.runName": tracking.run_name or self.config.name, "gmts.run_name": self.config.name,
                **tracking.tags}
        if tracking.parent_run_id:
            tags["mlflow.parentRunId"] = tracking.parent_run_id
        run = self.client.create_run(experiment_id, tags=tags)
        params = run_params(self.config)
        self.client.log_batch(run.info.run_id, params=[Param(k, v[:MAX_PARAM_CHARS]) for k, v in params.items()])
        self.log_json(self.config.model_dump(mode="json"), "config/resolved_config.json", run.info.run_id)
        logger.info("MLflow run %s in %s (%s)", run.info.run_id, tracking.experiment, self.uri)
        return run.info.run_id

    def log_base_checksum(self, checksum: str | None) -> None:
        """Tag the run with its base policy's weight checksum: two runs with the same tag started from the
        same weights, bit for bit (``orchestrator.base_policy``)."""
        self.client.set_tag(self.run_id, "base/checksum", checksum or "unrecorded (a downloaded checkpoint)")

    def log_datasets(self, train: tuple[str, list[Problem]], evaluation: dict[str, list[Problem]]) -> None:
        """The problems trained and evaluated on, as MLflow datasets (the run's Datasets column): each with a
        digest of its content, so two runs on the same problems show the same dataset."""
        inputs = [_dataset_input(*train, context="training")]
        inputs += [_dataset_input(name, problems, context="evaluation") for name, problems in evaluation.items()]
        self.client.log_inputs(self.run_id, datasets=inputs)

    def reopen(self) -> None:
        """Mark a resumed run as running again (it may have been left FAILED or RUNNING by a crash)."""
        self.client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        timestamp = int(time.time() * 1000)
        for key, value in metrics.items():
            if value is None or not math.isfinite(float(value)):
                continue
            self._pending.append(Metric(key, float(value), timestamp, step))

    def flush(self) -> None:
        for start in range(0, len(self._pending), 900):  # MLflow caps a batch at 1000 metrics
            self.client.log_batch(self.run_id, metrics=self._pending[start : start + 900])
        self._pending.clear()

    def log_json(self, payload: Any, artifact_path: str, run_id: str | None = None) -> None:
        folder, name = str(Path(artifact_path).parent), Path(artifact_path).name
        with tempfile.TemporaryDirectory() as tmp:
            file = Path(tmp) / name
            file.write_text(json.dumps(payload, indent=1))
            self.client.log_artifact(run_id or self.run_id, str(file), None if folder == "." else folder)

    def log_table(self, artifact_file: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                  pinned: bool = False) -> None:
        log_table(self.client, self.run_id, artifact_file, columns, rows, pinned=pinned)

    def finish(self, status: str = "FINISHED") -> None:
        if status != "FINISHED" and self.config.checkpoint.interval:
            # A resumed run restarts from the last checkpoint and logs these steps itself.
            self._pending.clear()
        try:
            self.flush()
        except Exception:
            if status == "FINISHED":
                raise
            # A failing run must still be marked FAILED, and its own error must not be masked.
            logger.exception("could not write the last metrics of failed run %s", self.run_id)
        self.client.set_terminated(self.run_id, status=status)


def log_table(client: MlflowClient, run_id: str, artifact_file: str, columns: Sequence[str],
              rows: Sequence[Sequence[Any]], *, pinned: bool = False) -> None:
    """A table artifact that the MLflow UI's artifact view shows as a table.

    The file is what ``MlflowClient.log_table`` writes (pandas' split-orient JSON), but written whole:
    ``log_table`` appends to an existing file, so a resumed run that repeats an evaluation would double its
    rows. The UI offers its table view for the files listed in the run's ``mlflow.loggedArtifacts`` tag, a
    JSON list that must stay under MLflow's tag length (longer values are cut, and a cut list no longer
    parses): past that the oldest unpinned entries leave the list (their files stay, shown as JSON text).
    """
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / Path(artifact_file).name
        file.write_text(json.dumps({"columns": list(columns), "data": [list(row) for row in rows]}))
        folder = str(Path(artifact_file).parent)
        client.log_artifact(run_id, str(file), None if folder == "." else folder)
    listed = json.loads(client.get_run(run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
    updated = table_listing(listed, artifact_file, pinned=pinned)
    if updated != listed:
        client.set_tag(run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps(updated))


def table_listing(listed: list[dict], artifact_file: str, *, pinned: bool = False,
                  limit: int = MAX_TAG_VAL_LENGTH) -> list[dict]:
    """``listed`` (the ``mlflow.loggedArtifacts`` entries) with ``artifact_file`` added as a table, dropping the
    oldest entries not ``pinned`` until the JSON fits in ``limit`` characters."""
    entry = {"path": artifact_file, "type": "table"}
    if pinned:
        entry["pinned"] = True
    if any(item.get("path") == artifact_file for item in listed):
        return listed
    updated = [*listed, entry]
    while len(json.dumps(updated)) > limit:
        oldest = next((i for i, item in enumerate(updated[:-1]) if not item.get("pinned")), None)
        if oldest is None:
            break
        del updated[oldest]
    return updated
