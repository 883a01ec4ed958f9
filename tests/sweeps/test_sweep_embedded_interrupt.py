"""Ctrl-C of ``python -m sweeps.run`` on its own embedded Ray (the README's ``make demo`` path), then ``--resume``.

The multi-node end-to-end test (test_sweep_e2e.py) interrupts a CLI attached to a cluster it did not start; here the
CLI starts Ray itself, as on a laptop. A one-trial sweep is interrupted (SIGINT, as Ctrl-C) after its first
checkpoint: the CLI exits 3 naming the unfinished trial and the command that resumes it, and every process it started
(Ray's servers, the trial's driver, its vLLM engine, learner and reward worker) is gone. ``--resume`` on a new
embedded Ray trains only the steps after that checkpoint: each step is logged once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow import MlflowClient

from sweeps.parent_run import PARENT_TAG
from tests.sweeps.cli_process import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
# Steps of ≈ 0.2 s: after the first checkpoint the trial has seconds left, so Ctrl-C always finds it unfinished.
STEPS, CHECKPOINT_EVERY = 20, 2
PRESET = {
    "extends": "cpu-tiny-s",
    "warmup": {"enabled": False},  # the plumbing is under test, not learning
    "rollout": {"n_samples": 4},
    "data": {"eval": {"arithmetic": {"source": "arithmetic", "split": "test", "limit": 8},
                      "arithmetic_val": {"source": "arithmetic", "split": "validation", "limit": 8}},
             "prompts_per_step": 8},
    "learner": {"mini_batch_size": 32, "micro_batch_size": 32},
    "training": {"steps": STEPS},
    "evaluation": {"interval": 0},
    "checkpoint": {"interval": CHECKPOINT_EVERY, "keep_last": 2},
    "resources": {"cpus_per_rollout_actor": 0.99},  # with the driver's 0.01 CPU: the trial fits 2 CPUs
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "GMTS_STORAGE")}
    return {**env, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}


def _alive(processes: dict[psutil.Process, str]) -> list[str]:
    alive = []
    for process, name in processes.items():
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{process.pid} {name}")
        except psutil.NoSuchProcess:
            pass
    return alive


@contextlib.contextmanager
def _cli(command: list[str], log):
    """The CLI in a session of its own; whatever of that session outlives the block (a failed test) is killed."""
    proc = subprocess.Popen(command, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == proc.pid:
                    process.kill()
            except (psutil.Error, ProcessLookupError):
                pass


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    import ray

    ray.shutdown()  # the suite's shared embedded Ray, were it up: the CLI starts its own
    tmp = tmp_path_factory.mktemp("interrupt")
    (tmp / "preset.yaml").write_text(yaml.safe_dump(PRESET))
    spec = tmp / "ctrl-c.yaml"
    spec.write_text(yaml.safe_dump({"name": "ctrl-c", "base": {"preset": str(tmp / "preset.yaml")},
                                    "grid": {"method": ["ets"], "ratio": [0.2], "mode": ["top"], "seed": [0]}}))
    out, first_log, resume_log = tmp / "out", tmp / "first.log", tmp / "resume.log"
    command = [sys.executable, "-m", "sweeps.run", str(spec), "--output-dir", str(out)]
    with open(first_log, "w") as log, _cli(command, log) as proc:
        wait_for(lambda: next(iter(out.glob("ctrl-c-*/ctrl-c-t000/checkpoints/step_*/run_state.json")), None),
                 proc, 300, "the trial's first checkpoint")
        started = {}
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                started[child] = child.name()
            except psutil.NoSuchProcess:
                pass
        proc.send_signal(signal.SIGINT)
        first_rc = proc.wait(timeout=120)
        deadline = time.monotonic() + 20  # what it started may take a moment to be reaped
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _alive(started)
    with open(resume_log, "w") as log, _cli([*command, "--resume"], log) as proc:
        resume_rc = proc.wait(timeout=420)
    return {"first_rc": first_rc, "first_log": first_log.read_text(), "started": sorted(set(started.values())),
            "left": left, "resume_rc": resume_rc, "resume_log": resume_log.read_text(),
            "tracking_uri": f"sqlite:///{out / 'mlflow.db'}"}


def test_ctrl_c_stops_everything_the_cli_started(interrupted: dict) -> None:
    log = interrupted["first_log"]
    assert interrupted["first_rc"] == 3, log[-3000:]
    assert "1 trial(s) unfinished" in log and "ctrl-c-t000" in log.split("unfinished:")[-1]
    assert "Rerun only the unfinished trials with:" in log and "--resume" in log.split("Rerun only")[-1]
    assert any(name in ("raylet", "gcs_server") for name in interrupted["started"]), interrupted["started"]
    assert interrupted["left"] == [], interrupted["left"]


def test_resume_on_a_new_embedded_ray_trains_each_step_once(interrupted: dict) -> None:
    said = interrupted["resume_log"]
    assert interrupted["resume_rc"] == 0, said[-5000:]
    client = MlflowClient(interrupted["tracking_uri"])
    ids = [e.experiment_id for e in client.search_experiments()]
    (trial,) = client.search_runs(ids, f"tags.`{PARENT_TAG}` != ''")
    assert trial.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(trial.info.run_id, "reward/mean"))
    assert steps == list(range(1, STEPS + 1))
    # Only what came after the interruption's checkpoint ran again: the resumed attempt did not start at step 1.
    assert "(t000) step 1/" not in said and f"(t000) step {STEPS}/" in said, said[-3000:]
