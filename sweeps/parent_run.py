"""The MLflow side of a sweep: the store, the experiment, and the sweep's parent run.

One parent run per sweep, found again by its ``gmts.sweep_id`` tag (so ``--resume`` reuses it);
each trial's run is a child of it (``tracking.parent_run_id``), opened by ``orchestrator.train``.
"""

from __future__ import annotations

import logging
import os
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from mlflow import MlflowClient
from mlflow.entities import Param, Run, RunStatus, RunTag

if TYPE_CHECKING:  # the spec pulls in the experiment config (torch): sweeps.report reads runs without it
    from sweeps.spec import SweepSpec
    from sweeps.storage import SweepStorage

logger = logging.getLogger(__name__)

SWEEP_ID_TAG = "gmts.sweep_id"
SPEC_NAME_TAG = "gmts.spec"
TRIAL_TAG = "gmts.trial"
PARENT_TAG = "mlflow.parentRunId"
LR_SOURCE_TAG = "gmts.lr_source"  # where the spec's fixed lrs come from (the report's header cites it)
DESCRIPTION_TAG = "gmts.description"  # the spec's description (the run's note becomes it plus the table)
# MLflow ≥ 3 shows an experiment of this kind in its "Model training" view (when its sidebar has no
# GenAI / Model training switch; with the switch, the URLs the sweep prints carry workflowType instead).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
PARENT_COLOR = "#000000"  # the parent's colour in MLflow's charts, apart from every method's (sweeps.labels)
DISTRIBUTION = "gmts-lab"


def resolve_tracking_uri(spec: SweepSpec, output_dir: Path) -> str:
    """The spec's URI, else $MLFLOW_TRACKING_URI, else a SQLite store in ``output_dir``.

    Resolved once by the driver and written into every trial's config, so that trials (whose
    working directory Ray Tune changes) log into the same store as the parent run.
    """
    if spec.tracking_uri:
        return spec.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    # Imported here: the experiment config pulls in torch, and sweeps.report imports this module without it.
    from orchestrator.config import UnfindableStore, default_store_uri
    from orchestrator.config_loader import ConfigError

    try:  # not inside Ray's temporary working-dir copy of a `ray job submit` (orchestrator/config.py)
        return default_store_uri(Path(output_dir), "tracking_uri", "--output-dir")
    except UnfindableStore as exc:
        raise ConfigError(str(exc)) from None


def default_tracking_uri(output_dir: Path) -> str:
    return f"sqlite:///{(Path(output_dir) / 'mlflow.db').resolve()}"


def ensure_experiment(client: MlflowClient, name: str, artifact_root: Path | str | None) -> str:
    """The experiment's id, creating it with an absolute artifact location (a folder or a URI) when it is new.

    With a SQLite store MLflow would otherwise put artifacts under ``./mlruns`` of whichever
    process creates the experiment; trial processes run in Ray Tune's trial folders.
    """
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if EXPERIMENT_KIND_TAG not in experiment.tags:
            client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
        return experiment.experiment_id
    location = (artifact_root if isinstance(artifact_root, str) or artifact_root is None
                else Path(artifact_root).resolve().as_uri())
    return client.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})


def artifact_root_for(tracking_uri: str, storage: SweepStorage) -> str | None:
    """A local store's artifacts go to the sweep's storage (``mlartifacts/`` there: a folder beside the store, or
    the object store); a tracking server keeps its own artifact root."""
    if tracking_uri.startswith(("sqlite:", "file:")) or "://" not in tracking_uri:
        return storage.uri_of("mlartifacts")
    return None


def code_version() -> str:
    """The git commit of this checkout (``-dirty`` with local changes), else the package version."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = _git(root, "rev-parse", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
        return f"{sha}-dirty" if dirty else sha
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        pass
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=10
    ).stdout.strip()


def find_parent_run(client: MlflowClient, sweep_id: str, experiment_ids: list[str] | None = None) -> Run | None:
    """The parent run tagged with ``sweep_id`` (the newest, should there be several)."""
    ids = experiment_ids or [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(
        ids, filter_string=f"tags.`{SWEEP_ID_TAG}` = '{sweep_id}'", order_by=["attributes.start_time DESC"]
    )
    parents = [run for run in runs if PARENT_TAG not in run.data.tags]
    return parents[0] if parents else None


def open_parent_run(
    client: MlflowClient,
    *,
    experiment_id: str,
    sweep_id: str,
    spec: SweepSpec,
    grid_size: int,
    spec_file: Path,
) -> Run:
    """Reopen the sweep's parent run (resume) or create it with its params and the spec artifact."""
    existing = find_parent_run(client, sweep_id, [experiment_id])
    if existing is not None:
        client.update_run(existing.info.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        logger.info("reusing parent run %s of sweep %s", existing.info.run_id, sweep_id)
        return existing
    run = client.create_run(
        experiment_id,
        run_name=sweep_id,
        tags={SWEEP_ID_TAG: sweep_id, SPEC_NAME_TAG: spec.name, "mlflow.note.content": spec.description,
              DESCRIPTION_TAG: spec.description, LR_SOURCE_TAG: spec.lr_source, "mlflow.runColor": PARENT_COLOR},
    )
    params = {
        "spec_name": spec.name,
        "spec_hash": spec.spec_hash(),
        "code_version": code_version(),
        "grid_size": str(grid_size),
        "base_preset": spec.base.preset,
        "max_concurrent_trials": str(spec.max_concurrent_trials),
        "max_failures": str(spec.max_failures),
    }
    client.log_batch(
        run.info.run_id,
        params=[Param(key, value) for key, value in params.items()],
        tags=[RunTag("gmts.code_version", params["code_version"])],
    )
    client.log_artifact(run.info.run_id, str(spec_file))
    logger.info("parent run %s for sweep %s (%d trials)", run.info.run_id, sweep_id, grid_size)
    return run


def close_parent_run(client: MlflowClient, run_id: str, *, status: str) -> None:
    """FINISHED, FAILED (a trial failed) or KILLED (interrupted; ``--resume`` reopens it)."""
    client.set_terminated(run_id, status=status)
