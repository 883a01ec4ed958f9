"""Sweep efficiency: what the orchestration (Ray Tune, placement groups, MLflow parent run) costs.

A 4-trial grid (cpu-tiny-s, GMTS top-20 %, seeds 0–3, a few steps each) runs through the real CLI,
``python -m sweeps.run SPEC --output-dir DIR``, exactly as a user starts it (embedded Ray included).
Usable parallelism P = how many trial placement groups fit the machine's CPUs at once
(``orchestrator.resources.run_bundles``), which is also the spec's ``max_concurrent_trials``.
Each trial's own time is its MLflow run's duration (``train()`` from start to end, actor start-up
included). Figures: sweep wall time ÷ (Σ trial times / P) — 1.0 would be free orchestration — and
the absolute seconds that ratio leaves over.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.ray_session import REPO_ROOT
from benchmarks.report import BenchmarkResult, Figure, require_modules
from benchmarks.training_runs import rl_step_shape

logger = logging.getLogger(__name__)

PRESET = "cpu-tiny-s"


def settings_for(smoke: bool) -> dict:
    overrides = {"evaluation.interval": 0, "checkpoint.interval": 0, "data.eval.arithmetic.limit": 32, "data.eval.arithmetic_val.limit": 32,
                 # with the driver's 0.01 CPU, a trial's placement group is exactly 2 CPUs
                 "resources.cpus_per_rollout_actor": 0.99}
    if smoke:
        overrides.update({"training.steps": 1, "warmup.enabled": False, "data.prompts_per_step": 8,
                          "learner.mini_batch_size": 64, "learner.micro_batch_size": 64,
                          "data.eval.arithmetic.limit": 8, "data.eval.arithmetic_val.limit": 8})
        # One trial: a second one takes the same path again (CLI, Tune, placement group, MLflow child
        # run, report) at the cost of another set of actor start-ups; the 4-trial grid is for measuring.
        return {"seeds": [0], "overrides": overrides}
    overrides["training.steps"] = 5
    return {"seeds": [0, 1, 2, 3], "overrides": overrides}


def run(smoke: bool) -> dict:
    require_modules("sweeps.run", "sweeps.driver", "sweeps.tuner", "sweeps.trainable", "orchestrator.train")
    from orchestrator.config_loader import load_experiment
    from orchestrator.resources import run_bundles

    cfg = settings_for(smoke)
    trial_config = load_experiment(PRESET, [f"{k}={v}" for k, v in cfg["overrides"].items()])
    trial_cpus = sum(bundle.get("CPU", 0.0) for bundle in run_bundles(trial_config))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parallelism = max(1, math.floor(cpus / trial_cpus + 1e-9))
    spec = {
        "name": "bench-sweep",
        "description": "benchmarks.sweep_efficiency",
        "base": {"preset": PRESET, "overrides": cfg["overrides"]},
        "grid": {"method": ["gmts"], "ratio": [0.2], "mode": ["top"], "seed": cfg["seeds"]},
        "max_concurrent_trials": parallelism,
        "max_failures": 0,
    }
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        spec_path = Path(tmp) / "bench-sweep.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        out_dir = Path(tmp) / "out"
        started = time.perf_counter()
        completed = subprocess.run([sys.executable, "-m", "sweeps.run", str(spec_path), "--output-dir", str(out_dir)],
                                   cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        if completed.returncode != 0:
            raise RuntimeError(f"sweeps.run exited with {completed.returncode}:\n{completed.stdout[-3000:]}\n"
                               f"{completed.stderr[-3000:]}")
        trial_seconds = _trial_durations(out_dir)
    if len(trial_seconds) != len(cfg["seeds"]):
        raise RuntimeError(f"expected {len(cfg['seeds'])} trial runs in MLflow, found {len(trial_seconds)}")
    ideal = sum(trial_seconds) / parallelism
    figures = [
        Figure(f"sweep wall ÷ (Σ trial times / P), {len(trial_seconds)} trials, P={parallelism}", wall / ideal, "×",
               f"wall {wall:.0f} s vs ideal {ideal:.0f} s"),
        Figure("orchestration time (wall − Σ trial times / P)", wall - ideal, "s",
               "Ray start, Tune, placement groups, MLflow parent run and report, process start-up"),
        Figure("orchestration share of the sweep wall time", 100 * (wall - ideal) / wall, "%"),
    ]
    return BenchmarkResult(
        title="a 4-trial Tune grid vs the sum of its trials' times / usable parallelism",
        settings={"spec": spec, "rl_step": rl_step_shape(PRESET, [f"{k}={v}" for k, v in cfg["overrides"].items()]),
                  "trial_cpus": trial_cpus, "machine_cpus": cpus, "usable_parallelism": parallelism,
                  "command": "python -m sweeps.run SPEC --output-dir DIR"},
        figures=figures,
        measurements={"wall_seconds": wall, "trial_seconds": trial_seconds,
                      "median_trial_seconds": statistics.median(trial_seconds)},
    ).as_dict()


def _trial_durations(out_dir: Path) -> list[float]:
    """Seconds of every trial's MLflow run (child runs of the sweep's parent run), from the SQLite store."""
    from mlflow import MlflowClient

    from sweeps.parent_run import PARENT_TAG, default_tracking_uri

    client = MlflowClient(default_tracking_uri(out_dir))
    runs = [run for experiment in client.search_experiments()
            for run in client.search_runs([experiment.experiment_id], max_results=1000)]
    trials = [run for run in runs if PARENT_TAG in run.data.tags]
    return [(run.info.end_time - run.info.start_time) / 1000 for run in trials if run.info.end_time]
