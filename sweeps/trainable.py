"""The Ray Tune function trainable of a sweep: one trial = one ``orchestrator.train`` run.

Tune gives each trial a placement group built from ``run_bundles`` (driver first, then rollout
and learner actors); ``train`` finds it with ``ray.util.get_current_placement_group()`` and places
its actors inside it. Each step is reported to Tune; steps that saved a checkpoint also report it: a small
*marker* when the real checkpoint in the trial's ``run_dir`` is on storage every node sees, the real checkpoint
itself when the sweep's storage is an object store (``sweeps.storage``: Tune uploads it, and hands it back to a
restarted attempt, which puts it into its ``run_dir`` on whichever node it runs). When Tune restarts a crashed
trial (``FailureConfig.max_failures``) or resumes an interrupted sweep, ``train(resume=True)`` continues from
the run_dir's latest checkpoint, and reopens the same MLflow run without logging any step twice.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ray import tune

from orchestrator import console_logs
from orchestrator.checkpointing import RUN_STATE, step_dir
from orchestrator.config import ExperimentConfig
from orchestrator.resources import run_bundles

logger = logging.getLogger(__name__)

MARKER_FILE = "trial_checkpoint.json"
# Tune result keys of our own (train's metrics use "section/name" keys, so these cannot clash).
STEP_KEY = "step"
FINAL_KEY = "final"


def run_trial(tune_config: dict[str, Any], *, configs: dict[str, dict[str, Any]],
              checkpoints_travel: bool = False) -> None:
    """Tune entry point: ``tune_config["trial"]`` names the trial whose config is in ``configs``.

    ``checkpoints_travel``: report each real checkpoint to Tune (an object store holds the sweep's state), not a
    marker of it."""
    from orchestrator.train import train  # the RL loop pulls in torch/vLLM: import it in the trial only

    _log_to_console()
    # Tune moved this process into the trial's folder; relative paths in the config (data files)
    # mean what they mean for `orchestrator.train`: relative to the worker's own working directory.
    os.chdir(os.environ.get("TUNE_ORIG_WORKING_DIR", os.getcwd()))
    config = ExperimentConfig.model_validate(configs[tune_config["trial"]])
    if checkpoints_travel:  # no node sees another's run folder: the learner ranks' files must reach the driver's
        config = config.model_copy(update={"checkpoint": config.checkpoint.model_copy(update={"node_local": True})})
    reported = tune.get_checkpoint()
    if reported is not None:
        with reported.as_directory() as folder:
            if checkpoints_travel:
                take_back(Path(folder), config.run_dir)
            logger.info("%s: restarted by Tune after step %s", config.name, _marker_step(Path(folder)))

    def on_step(report) -> None:  # report: orchestrator.train.StepReport
        metrics = {**report.metrics, STEP_KEY: report.step, FINAL_KEY: 0}
        if report.checkpoint_dir is None:
            tune.report(metrics)
            return
        if checkpoints_travel:  # uploaded before report() returns; the folder stays in the run_dir
            _carry_run_files(config.run_dir, report.checkpoint_dir)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(report.checkpoint_dir))
            return
        with tempfile.TemporaryDirectory(prefix="gmts-marker-") as folder:
            payload = {"step": report.step, "checkpoint_dir": str(report.checkpoint_dir)}
            (Path(folder) / MARKER_FILE).write_text(json.dumps(payload))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))

    # The sweep's driver shows each trial's progress (sweeps/trial_progress.py), from what on_step reports.
    result = train(config, resume=True, on_step=on_step, show_progress=False)
    logger.info("%s: done after %d steps, run %s %s", config.name, result.steps, result.run_id,
                _short(result.final_metrics))
    tune.report({**result.final_metrics, STEP_KEY: result.steps, FINAL_KEY: 1, "run_id": result.run_id})


def trial_resources(tune_config: dict[str, Any], *, configs: dict[str, dict[str, Any]]) -> tune.PlacementGroupFactory:
    config = ExperimentConfig.model_validate(configs[tune_config["trial"]])
    return tune.PlacementGroupFactory(run_bundles(config), strategy="PACK")


def _run_files() -> tuple[str, ...]:
    """What a resumed run reads from its run folder besides the checkpoint: the base policy's recorded answers."""
    from orchestrator.evaluation import BASE_REFERENCE_FILE  # torch: in the trial only

    return (BASE_REFERENCE_FILE,)


def _carry_run_files(run_dir: Path, checkpoint: Path) -> None:
    for name in _run_files():
        if (run_dir / name).is_file() and not (checkpoint / name).is_file():
            shutil.copy2(run_dir / name, checkpoint / name)


def take_back(checkpoint: Path, run_dir: Path) -> Path:
    """Put a checkpoint Tune handed back into ``run_dir``, where ``train(resume=True)`` finds it: the run state last,
    since its presence marks a checkpoint complete (``orchestrator.checkpointing``), and the run files it carries
    (``_carry_run_files``) beside it. A folder already complete there (this node wrote it) is kept."""
    for name in _run_files():
        if (checkpoint / name).is_file() and not (run_dir / name).is_file():
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(checkpoint / name, run_dir / name)
    step = json.loads((checkpoint / RUN_STATE).read_text())["step"]
    target = step_dir(run_dir, step)
    if (target / RUN_STATE).is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)  # a save or an earlier take-back cut short
    shutil.copytree(checkpoint, target, ignore=shutil.ignore_patterns(RUN_STATE, *_run_files()))
    shutil.copy2(checkpoint / RUN_STATE, target / f".{RUN_STATE}.tmp")
    (target / f".{RUN_STATE}.tmp").replace(target / RUN_STATE)
    return target


def _marker_step(folder: Path) -> int | None:
    for name in (MARKER_FILE, RUN_STATE):  # a marker, or a real checkpoint (checkpoints_travel)
        if (folder / name).is_file():
            return json.loads((folder / name).read_text())["step"]
    return None


def _short(metrics: dict[str, float], limit: int = 4) -> str:
    keys = [k for k in ("reward/mean", "train/accuracy") if k in metrics] or sorted(metrics)[:limit]
    return " ".join(f"{k}={metrics[k]:.4g}" for k in keys[:limit])


def _log_to_console() -> None:
    """Trial processes are fresh Ray workers: send our INFO lines to stderr, which Ray forwards to the driver
    (the worker setup hook silenced INFO in every Ray worker; a trial prints its run's progress)."""
    console_logs.restore_info()
    root = logging.getLogger()
    if not any(isinstance(h, logging.StreamHandler) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(console_logs.FORMAT, console_logs.DATE_FORMAT))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
