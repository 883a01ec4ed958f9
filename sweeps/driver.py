"""Run a sweep end to end: validate, connect to Ray, open the parent run, run Tune, report.

Everything that can be checked is checked before anything starts: the spec and every trial's
config (``expand``), the resume target, and whether the largest trial fits the cluster.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import ray
from mlflow import MlflowClient

from orchestrator import console_logs
from orchestrator.cluster import start_embedded
from orchestrator.config_loader import ConfigError
from orchestrator.resources import run_bundles
from sweeps.labels import method_color, trial_label
from sweeps.layout import SweepLayout, SweepRecord, find_record, new_record, save_record
from sweeps.parent_run import (
    SPEC_NAME_TAG,
    SWEEP_ID_TAG,
    TRIAL_TAG,
    artifact_root_for,
    close_parent_run,
    ensure_experiment,
    open_parent_run,
    resolve_tracking_uri,
)
from sweeps.spec import SweepSpec, Trial, expand, trial_name
from sweeps.storage import SweepStorage
from sweeps.trainable import FINAL_KEY
from sweeps.tuner import TRIAL_KEY, build_tuner, can_restore, restore_tuner

logger = logging.getLogger(__name__)

RUN_COLOR_TAG = "mlflow.runColor"  # the run's colour in MLflow's charts: one per method, as in the plots


@dataclass(frozen=True)
class PreparedSweep:
    record: SweepRecord
    layout: SweepLayout
    trials: list[Trial]
    resume: bool
    storage_chosen: bool = True  # False: the caller's default folder, refused on a cluster of several nodes


@dataclass(frozen=True)
class SweepOutcome:
    sweep_id: str
    parent_run_id: str
    tracking_uri: str
    trials: int
    failed: list[str]  # trial names that ended in error
    unfinished: list[str]  # trial names stopped by an interruption (resume with --resume)


def prepare_sweep(spec: SweepSpec, output_dir: Path, resume: bool | str = False,
                  sweep_id: str | None = None, storage: str | Path | None = None,
                  storage_chosen: bool = True) -> PreparedSweep:
    """Validate the spec, every trial config and the resume target; touches nothing yet.

    ``resume``: False (a new sweep), True (the newest sweep of this spec) or a sweep id.
    ``sweep_id``: the id of a new sweep (default: spec name + UTC time).
    ``storage``: where the sweep's durable state goes (``sweeps.storage``; default ``output_dir``).
    ``storage_chosen``: False when neither was the user's choice (a default folder of this machine).
    """
    output_dir = Path(output_dir).resolve()
    durable = SweepStorage.at(storage if storage is not None else output_dir)
    if resume:
        record = find_record(output_dir, spec, None if resume is True else str(resume), durable)
    else:
        record = new_record(spec, output_dir, resolve_tracking_uri(spec, output_dir), sweep_id, durable)
    layout = SweepLayout(output_dir, record.sweep_id, durable)
    if resume and not can_restore(layout):
        raise ConfigError(f"--resume: sweep {record.sweep_id!r} has no Ray Tune state in {layout.tune_dir} to resume")
    trials = expand(spec, output_dir=layout.sweep_dir)
    return PreparedSweep(record, layout, trials, bool(resume), storage_chosen)


def run_sweep(prepared: PreparedSweep, spec: SweepSpec, address: str | None = None) -> SweepOutcome:
    record, layout = prepared.record, prepared.layout
    started_ray = connect_ray(address)
    try:
        check_capacity(prepared.trials, embedded=started_ray)
        check_storage(prepared)
        save_record(record, layout)
        client = MlflowClient(record.tracking_uri)
        experiment_id = ensure_experiment(
            client, spec.experiment, artifact_root_for(record.tracking_uri, layout.durable)
        )
        parent = open_parent_run(
            client,
            experiment_id=experiment_id,
            sweep_id=record.sweep_id,
            spec=spec,
            grid_size=len(prepared.trials),
            spec_file=layout.spec_file,
        )
        parent_id = parent.info.run_id
        trials = nest_trials(prepared.trials, record, parent_id)
        # Every checkpoint marker forces a Tune state snapshot; with checkpoints seconds apart Tune warns each time.
        os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
        tuner = restore_tuner(trials, layout) if prepared.resume else build_tuner(spec, trials, layout)
        logger.info("sweep %s: %d trials, Tune folder %s", record.sweep_id, len(trials), layout.tune_dir)
        try:
            results = tuner.fit()
        except BaseException:
            close_parent_run(client, parent_id, status="FAILED")
            raise
        failed = sorted(str(r.config.get(TRIAL_KEY)) for r in results if r.error is not None)
        # A trial is done when its last result is the one run_trial reports after train() returned;
        # anything else was stopped by an interruption (Ctrl-C / SIGINT: Tune saves its state and returns).
        unfinished = sorted(
            str(r.config.get(TRIAL_KEY)) for r in results if r.error is None and (r.metrics or {}).get(FINAL_KEY) != 1
        )
        status = "FAILED" if failed else "KILLED" if unfinished else "FINISHED"
        close_parent_run(client, parent_id, status=status)
        return SweepOutcome(record.sweep_id, parent_id, record.tracking_uri, len(trials), failed, unfinished)
    finally:
        if started_ray:
            ray.shutdown()


def nest_trials(trials: list[Trial], record: SweepRecord, parent_run_id: str) -> list[Trial]:
    """Point every trial's MLflow run at the sweep's store and parent run, tagged with the sweep."""
    nested = []
    for trial in trials:
        tracking = trial.config.tracking.model_copy(
            update={
                "tracking_uri": record.tracking_uri,
                "parent_run_id": parent_run_id,
                "run_name": trial.config.tracking.run_name or trial_label(trial.point),
                "tags": {
                    **trial.config.tracking.tags,
                    SWEEP_ID_TAG: record.sweep_id,
                    SPEC_NAME_TAG: record.spec_name,
                    TRIAL_TAG: trial.name,
                    RUN_COLOR_TAG: method_color(trial.config.selection.label),
                },
            }
        )
        config = trial.config.model_copy(update={"tracking": tracking})
        nested.append(trial.model_copy(update={"config": config}))
    return nested


def connect_ray(address: str | None) -> bool:
    """Connect to ``address`` or $RAY_ADDRESS (e.g. inside ``ray job submit``), else start an
    embedded local Ray (never attaching to some other local cluster). True if we started it.

    Ray's own INFO lines stay off, and the workers get the console choice (``orchestrator.console_logs``);
    inside a submitted job the job's runtime_env is the submitter's, so only the environment carries it."""
    if ray.is_initialized():
        return False
    quiet = {"logging_level": logging.INFO if console_logs.verbose() else logging.WARNING}
    if address:
        ray.init(address=address, runtime_env=console_logs.runtime_env(), **quiet)
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(**quiet)
        return False
    # No dashboard: nothing here uses the Jobs or state API, and its processes cost start-up CPU and leave their
    # multiprocessing forkserver's pymp-* folder in /tmp when the cluster stops.
    start_embedded(runtime_env=console_logs.runtime_env(), include_dashboard=False, **quiet)
    return True


def check_storage(prepared: PreparedSweep) -> None:
    """On several nodes a trial restarts wherever its bundles fit, and resumes only from state that node can read:
    refuse this machine's default folder, warn that a chosen folder must be mounted by every node."""
    nodes = sum(1 for node in ray.nodes() if node["Alive"])
    durable = prepared.layout.durable
    if nodes < 2 or durable.remote:
        return
    if not prepared.storage_chosen:
        raise ConfigError(f"the cluster has {nodes} nodes and the sweep's state would go to {durable.uri}, a folder "
                          f"of this machine: pass --storage s3://bucket/prefix (or $GMTS_STORAGE), or --output-dir "
                          f"on storage every node mounts")
    logger.warning("sweep %s: %d Ray nodes, storage %s: a trial restarted on another node resumes only if every node "
                   "mounts that folder (else pass --storage s3://…)", prepared.record.sweep_id, nodes, durable.uri)


def check_capacity(trials: list[Trial], *, embedded: bool) -> None:
    """A trial whose placement group exceeds the cluster would wait forever: fail now instead.

    On an external cluster an autoscaler may still add nodes, so there it is only a warning.
    """
    available = ray.cluster_resources()
    for trial in trials:
        need: dict[str, float] = {}
        for bundle in run_bundles(trial.config):
            for resource, amount in bundle.items():
                need[resource] = need.get(resource, 0.0) + amount
        short = {r: (a, available.get(r, 0.0)) for r, a in need.items() if a > available.get(r, 0.0) + 1e-9}
        if not short:
            continue
        detail = ", ".join(f"{r}: needs {a:g}, cluster has {h:g}" for r, (a, h) in short.items())
        message = (
            f"trial {trial.name} ({trial_name(trial.point)}): its placement group does not fit the cluster "
            f"({detail}); lower resources.cpus_per_rollout_actor / cpus_per_learner_actor / "
            f"cpus_per_reward_worker (or the GPU fields), "
            f"rollout.num_actors or learner.num_actors"
        )
        if embedded:
            raise ConfigError(message)
        logger.warning("%s (waiting for the autoscaler)", message)

