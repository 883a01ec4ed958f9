"""End to end: a real 2-trial sweep (Ray Tune, the tiny model, a real SQLite MLflow store), with the
faults a sweep must survive, run once for the whole module:

1. while trial 0 runs, its learner actor's process is killed (SIGKILL) right after its first
   checkpoint: Tune restarts the trial, which resumes from that checkpoint, not from zero;
2. while trial 1 runs, its rollout actor's process (the vLLM engine) is killed right after its first
   checkpoint: Tune restarts the trial from that checkpoint too;
3. as Tune restarts trial 1, the sweep itself is interrupted (SIGINT, as Ctrl-C): ``--resume`` then reruns
   only trial 1, from the checkpoint Tune's restart began from, and finishes the sweep.

Both trials roll out one step ahead of their learner (``rollout.max_staleness: 1``), so each fault strikes while
a batch is being collected beside the update: the resumed trial continues from the batch its checkpoint held,
and the collection in flight is collected again by the same weights (nothing trained twice, nothing skipped).

The faults come from the test harness watching the sweep's files and processes (the CLI runs in a
subprocess; its embedded Ray cluster is its own descendants, so only this sweep's actors are
killed): production code has no test hook.
"""

from __future__ import annotations

import json
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

from sweeps.tracking import PARENT_TAG, SWEEP_ID_TAG
from tests.sweeps.cli_process import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
STEPS, CHECKPOINT_EVERY = 6, 2
LEARNER_PROCESS = "ray::LearnerEngine"  # LearnerActor = ray.remote(LearnerEngine)
ROLLOUT_PROCESS = "ray::RolloutEngine"  # RolloutActor = ray.remote(RolloutEngine)
RESTARTED = "{}: restarted by Tune after step"  # sweeps.trainable logs it as a restarted attempt begins
PRESET = {
    "extends": "cpu-tiny-s",
    "warmup": {"enabled": False},  # the plumbing is under test, not learning: skip the supervised warm-up
    "rollout": {"n_samples": 4, "max_staleness": 1},
    # Both of the preset's held-out sets cut to 8 problems: left out here, the validation set keeps all its
    # 1,246, evaluated (with a learner forward for kl_to_base) at step 0 and at the end of every attempt.
    "data": {"eval": {"arithmetic": {"source": "arithmetic", "split": "test", "limit": 8},
                      "arithmetic_val": {"source": "arithmetic", "split": "validation", "limit": 8}},
             "prompts_per_step": 8},
    "learner": {"mini_batch_size": 32, "micro_batch_size": 32, "old_logp_source": "rollout"},
    "training": {"steps": STEPS},
    "evaluation": {"interval": 0},
    "checkpoint": {"interval": CHECKPOINT_EVERY, "keep_last": 2},
    "resources": {"cpus_per_rollout_actor": 0.99},  # with the driver's 0.01 CPU: a 2-CPU placement group
}


def _checkpoint(sweep_dir: Path, trial: str, step: int) -> Path:
    return sweep_dir / trial / "checkpoints" / f"step_{step:06d}" / "run_state.json"


def _actor_processes(root_pid: int, title: str) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            if child.cmdline() and child.cmdline()[0].startswith(title):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sweeps.run", *args]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("e2e")
    (tmp / "preset.yaml").write_text(yaml.safe_dump(PRESET))
    spec = {"name": "e2e", "base": {"preset": str(tmp / "preset.yaml")}, "max_failures": 2,
            "grid": {"method": ["ets", "gmts"], "ratio": [0.2], "mode": ["top"], "seed": [0]}}
    (tmp / "e2e.yaml").write_text(yaml.safe_dump(spec))
    out = tmp / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200")

    started = time.monotonic()
    with open(tmp / "first.log", "w") as log:
        proc = subprocess.Popen(_cli(str(tmp / "e2e.yaml"), "--output-dir", str(out)), cwd=REPO, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            sweep_dir = wait_for(lambda: next(iter(out.glob("e2e-*/sweep.json")), None), proc, 120, "sweep.json").parent
            wait_for(lambda: _checkpoint(sweep_dir, "e2e-t000", CHECKPOINT_EVERY).is_file(), proc, 600,
                      "trial 0's first checkpoint")
            learners = wait_for(lambda: _actor_processes(proc.pid, LEARNER_PROCESS), proc, 60,
                                 "trial 0's learner process")
            for learner in learners:
                learner.send_signal(signal.SIGKILL)
            wait_for(lambda: _checkpoint(sweep_dir, "e2e-t001", CHECKPOINT_EVERY).is_file(), proc, 600,
                      "trial 1's first checkpoint")
            engines = wait_for(lambda: _actor_processes(proc.pid, ROLLOUT_PROCESS), proc, 60,
                                "trial 1's rollout process")
            for engine in engines:
                engine.send_signal(signal.SIGKILL)
            # Ctrl-C as Tune restarts the trial: the restarted attempt logs its restart before it starts its actors
            # (seconds), so the sweep stops with trial 1 unfinished whatever step the 0.1 s steps had reached when
            # the engine died.
            wait_for(lambda: RESTARTED.format("e2e-t001") in (tmp / "first.log").read_text(), proc, 600,
                      "trial 1's restart by Tune")
            proc.send_signal(signal.SIGINT)
            first_rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    first_seconds = time.monotonic() - started
    # The latest checkpoint of trial 1 when the sweep stopped, the one --resume must continue from: Tune's restart
    # began from it (or, had Ctrl-C taken effect only after the restarted attempt's first 0.1 s steps, from one before).
    interrupted_at = max(step for step in range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)
                         if _checkpoint(sweep_dir, "e2e-t001", step).is_file())

    started = time.monotonic()
    resumed = subprocess.run(_cli(str(tmp / "e2e.yaml"), "--output-dir", str(out), "--resume"), cwd=REPO, env=env, check=False,
                             capture_output=True, text=True, timeout=900)
    (tmp / "resume.log").write_text(resumed.stdout + resumed.stderr)
    return {
        "tmp": tmp, "out": out, "sweep_dir": sweep_dir, "sweep_id": sweep_dir.name,
        "killed": {"learner": learners, "rollout": engines},
        "first_rc": first_rc, "first_log": (tmp / "first.log").read_text(), "interrupted_at": interrupted_at,
        "resume_rc": resumed.returncode, "resume_log": resumed.stdout + resumed.stderr,
        "seconds": (first_seconds, time.monotonic() - started),
        "client": MlflowClient(f"sqlite:///{out / 'mlflow.db'}"),
    }


def _children(sweep: dict) -> tuple[object, list]:
    client = sweep["client"]
    ids = [e.experiment_id for e in client.search_experiments()]
    parents = client.search_runs(ids, f"tags.`{SWEEP_ID_TAG}` = '{sweep['sweep_id']}'")
    parents = [p for p in parents if PARENT_TAG not in p.data.tags]
    assert len(parents) == 1
    children = client.search_runs(ids, f"tags.`{PARENT_TAG}` = '{parents[0].info.run_id}'")
    return parents[0], children


def test_interrupted_sweep_resumes_and_finishes(sweep: dict) -> None:
    print("wall seconds (first run, resume):", sweep["seconds"])
    assert sweep["first_rc"] == 3, sweep["first_log"][-3000:]  # interrupted, trial 1 unfinished
    assert sweep["resume_rc"] == 0, sweep["resume_log"][-5000:]
    assert "e2e-t001" in sweep["first_log"].split("unfinished:")[-1]
    # Only the unfinished trial ran again: the driver's progress lines name trials as Tune's table does.
    assert "(t001) step " in sweep["resume_log"]
    assert "(t000) step " not in sweep["resume_log"]
    assert "gmts" in sweep["resume_log"] and "mlflow ui --backend-store-uri" in sweep["resume_log"]


def test_parent_and_children_in_mlflow(sweep: dict) -> None:
    parent, children = _children(sweep)
    assert parent.info.status == "FINISHED"
    params = parent.data.params
    assert params["spec_name"] == "e2e" and params["grid_size"] == "2" and len(params["spec_hash"]) == 12
    assert params["code_version"]
    client = sweep["client"]
    assert "spec.yaml" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    # One run per trial: each fault came after a checkpoint, so each trial reopened its own run.
    assert sorted(c.data.params["method"] for c in children) == ["ets", "gmts"]
    for child in children:
        assert child.info.status == "FINISHED"
        p = child.data.params
        assert (p["ratio"], p["mode"], p["algorithm"], p["seed"], p["model_size"]) == ("0.2", "top", "grpo", "0", "tiny-s")
        assert "eval/arithmetic/accuracy" in child.data.metrics


def test_no_metric_step_logged_twice(sweep: dict) -> None:
    client = sweep["client"]
    _, children = _children(sweep)
    for child in children:
        for key in child.data.metrics:
            steps = [m.step for m in client.get_metric_history(child.info.run_id, key)]
            assert len(steps) == len(set(steps)), (child.data.params["method"], key, sorted(steps))
        reward_steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, "reward/mean"))
        assert reward_steps == list(range(1, STEPS + 1))
        # Across the fault too, each step trained the batch collected one step before it (its checkpoint held it).
        lag = {m.step: m.value for m in client.get_metric_history(child.info.run_id, "rollout/staleness")}
        assert lag == {1: 0.0, **{step: 1.0 for step in range(2, STEPS + 1)}}


def _attempt_starts(sweep: dict, trial: str) -> tuple[list[int], list[dict]]:
    """The first step of each attempt of ``trial``, from Tune's own record of its reports (the first report of
    an attempt has iterations_since_restore == 1), and those reports."""
    tune_dir = sweep["out"] / "ray_results" / sweep["sweep_id"]
    result_file = next(tune_dir.glob(f"*trial={trial}*/result.json"))
    rows = [json.loads(line) for line in result_file.read_text().splitlines() if line.strip()]
    return [row["step"] for row in rows if row["iterations_since_restore"] == 1], rows


def test_killed_learner_trial_resumed_from_its_checkpoint(sweep: dict) -> None:
    assert sweep["killed"]["learner"], "no learner process was killed"
    # The second attempt starts right after a checkpoint, not at 1.
    attempt_starts, rows = _attempt_starts(sweep, "e2e-t000")
    assert len(attempt_starts) == 2 and attempt_starts[0] == 1, attempt_starts
    assert attempt_starts[1] > 1 and (attempt_starts[1] - 1) % CHECKPOINT_EVERY == 0, attempt_starts
    assert rows[-1]["step"] == STEPS and rows[-1]["final"] == 1
    assert "restarted by Tune after step" in sweep["first_log"]


def test_killed_rollout_trial_resumed_from_its_checkpoint(sweep: dict) -> None:
    assert sweep["killed"]["rollout"], "no rollout process was killed"
    # Tune restarted the trial after the engine died, from the checkpoint saved last before that (the first, or a
    # later one when the 0.1 s steps outran the kill); the sweep was interrupted while that attempt started.
    restarts = [int(line.rsplit(" ", 1)[-1]) for line in sweep["first_log"].splitlines()
                if RESTARTED.format("e2e-t001") in line]
    assert len(restarts) == 1 and restarts[0] >= CHECKPOINT_EVERY and restarts[0] % CHECKPOINT_EVERY == 0, restarts
    interrupted_at = sweep["interrupted_at"]
    assert interrupted_at >= restarts[0]
    # Tune's record: the first attempt from step 1, every later one (an interrupted start reports nothing) right
    # after a checkpoint; the last, --resume's, after the latest saved before the sweep stopped.
    attempt_starts, rows = _attempt_starts(sweep, "e2e-t001")
    assert attempt_starts[0] == 1 and len(attempt_starts) >= 2, attempt_starts
    assert all(start > 1 and (start - 1) % CHECKPOINT_EVERY == 0 for start in attempt_starts[1:]), attempt_starts
    last_attempt = rows[max(i for i, row in enumerate(rows) if row["iterations_since_restore"] == 1):]
    if interrupted_at < STEPS:  # the resumed attempt trains every step after that checkpoint, once
        assert [row["step"] for row in last_attempt] == [*range(interrupted_at + 1, STEPS + 1), STEPS]
    else:  # every step was trained before the sweep stopped: the resumed attempt only evaluates and reports
        assert [row["step"] for row in last_attempt] == [STEPS]
    assert rows[-1]["step"] == STEPS and rows[-1]["final"] == 1


def test_report_artifacts_on_the_parent(sweep: dict) -> None:
    parent, _ = _children(sweep)
    listed = {a.path for a in sweep["client"].list_artifacts(parent.info.run_id, "ablation")}
    for name in ("ablation.csv", "ablation.md", "ablation.html", "ablation.json", "accuracy_vs_ratio.png",
                 "learning_curves.png"):
        assert f"ablation/{name}" in listed
    table = json.loads((sweep["sweep_dir"] / "report" / "ablation.json").read_text())
    # One test cell (the validation set's cell only chooses lrs), with its Δ over ETS at the same scope.
    gmts = [c for c in table["cells"] if c["method"] == "gmts" and c["metric"] == "accuracy" and c["split"] == "test"]
    assert len(gmts) == 1 and gmts[0]["delta_vs_ets"] is not None


def test_each_arm_links_what_its_model_says(sweep: dict, tmp_path: Path) -> None:
    """Both trials were restarted (one by Tune, one by --resume): each still holds one completions table per eval
    set for step 0 and the last step, rows not doubled, and the report links the last one per arm."""
    parent, children = _children(sweep)
    client = sweep["client"]
    finished = [run for run in children if run.info.status == "FINISHED"]
    assert len(finished) == 2
    for run in finished:
        for name in ("arithmetic", "arithmetic_val"):
            files = [a.path for a in client.list_artifacts(run.info.run_id, f"completions/{name}")]
            assert files == [f"completions/{name}/step_{step:06d}.json" for step in (0, STEPS)]
            table = json.loads(Path(client.download_artifacts(run.info.run_id, files[-1], str(tmp_path))).read_text())
            rows = [dict(zip(table["columns"], row)) for row in table["data"]]
            assert [row["index"] for row in rows] == list(range(8))  # the set's 8 problems, each once
            assert sum(row["reward"] for row in rows) / 8 == pytest.approx(run.data.metrics[f"eval/{name}/accuracy"])
    markdown = (sweep["sweep_dir"] / "report" / "ablation.md").read_text()
    links = [line for line in markdown.splitlines() if line.startswith("- ") and "/artifacts/completions/" in line]
    assert len(links) == 2 and all(f"step_{STEPS:06d}.json" in line for line in links)
    assert f"/artifacts/completions/arithmetic/step_{STEPS:06d}.json" in parent.data.tags["mlflow.note.content"]
