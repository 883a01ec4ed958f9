"""The Ray Tune function trainable of a sweep: one trial = one ``orchestrator.train`` run.

Tune gives each trial a placement group built from ``run_bundles`` (driver first, then rollout
and learner actors); ``train`` finds it with ``ray.util.get_current_placement_group()`` and places
its actors inside it. Each step is reported to Tune; steps that saved a checkpoint also report a
small *marker* checkpoint. The real checkpoint lives in the trial's ``run_dir``: when Tune restarts
a crashed trial (``FailureConfig.max_failures``) or resumes an interrupted sweep, ``train(resume=True)``
continues from it, and reopens the same MLflow run without logging any step twice.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from ray import tune

from orchestrator import console_logs
from orchestrator.config import ExperimentConfig
from orchestrator.resources import run_bundles

logger = logging.getLogger(__name__)

MARKER_FILE = "trial_checkpoint.json"
# Tune result keys of our own (train's metrics use "section/name" keys, so these cannot clash).
STEP_KEY = "step"
FINAL_KEY = "final"


def run_trial(tune_config: dict[str, Any], *, configs: dict[str, dict[str, Any]]) -> None:
    """Tune entry point: ``tune_config["trial"]`` names the trial whose config is in ``configs``."""
    from orchestrator.train import train  # the RL loop pulls in torch/vLLM: import it in the trial only

    _log_to_console()
    # Tune moved this process into the trial's folder; relative paths in the config (data files)
    # mean what they mean for `orchestrator.train`: relative to the worker's own working directory.
    os.chdir(os.environ.get("TUNE_ORIG_WORKING_DIR", os.getcwd()))
    config = ExperimentConfig.model_validate(configs[tune_config["trial"]])
    marker = tune.get_checkpoint()
    if marker is not None:
        with marker.as_directory() as folder:
            logger.info("%s: restarted by Tune after step %s", config.name, _marker_step(Path(folder)))

    def on_step(report) -> None:  # report: orchestrator.train.StepReport
        metrics = {**report.metrics, STEP_KEY: report.step, FINAL_KEY: 0}
        if report.checkpoint_dir is None:
            tune.report(metrics)
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


def _marker_step(folder: Path) -> int | None:
    file = folder / MARKER_FILE
    return json.loads(file.read_text())["step"] if file.is_file() else None


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
