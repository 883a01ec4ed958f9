"""End to end over real components, loopback only: a Ray head started with token authentication, an
``mlflow server`` (SQLite), and the API as a ``gmts serve`` process.

1. a tiny two-trial sweep (ETS vs GMTS at 20 %, one RL step each) is submitted over HTTP;
2. once it runs, the API process is restarted: the new one reports the status Ray reports;
3. a second sweep is submitted and cancelled while it waits behind the first: Ray says STOPPED, MLflow
   says KILLED;
4. the first sweep is polled to success and its results equal ``sweeps.report.ablation_results`` read
   straight from MLflow;
5. single runs are cancelled at points of a job's life (right after submit, while queued/starting;
   while training, with its actors up): each time Ray says STOPPED, no process of the job is left on
   the machine, Ray's state API lists no live driver or actor of it, and its MLflow runs are KILLED.

Everything started here is stopped here: the Ray head through its process group plus every
descendant recorded before teardown (Ray starts job drivers in their own sessions), never
``ray stop``, which would stop other people's clusters on this machine too.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from mlflow import MlflowClient

from api.ray_jobs import RayJobs
from api.tracking import API_ID_TAG
from sweeps.report import ablation_results
from sweeps.tracking import PARENT_TAG
from tests.api.support import bearer, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
TOKEN = "integration-" + secrets.token_hex(12)
# cpu-tiny-s cut down to seconds of work per trial (as in tests/sweeps/test_sweep_e2e.py).
TINY_OVERRIDES = {
    "warmup.steps": 40, "warmup.examples": 500,  # a base policy in seconds (cached)
    "rollout.n_samples": 4,
    "data.eval.arithmetic.limit": 16, "data.eval.arithmetic_val.limit": 16, "data.prompts_per_step": 8,
    "learner.mini_batch_size": 32, "learner.micro_batch_size": 32,
    "training.steps": 1,
    "evaluation.interval": 0,
    "checkpoint.interval": 0,
    "resources.cpus_per_rollout_actor": 0.99,  # with the driver's 0.01 CPU: one trial = the 2 CPUs
}


def _sweep(name: str) -> dict:
    return {"name": name, "base": {"preset": "cpu-tiny-s", "overrides": TINY_OVERRIDES},
            "grid": {"method": ["ets", "gmts"], "ratio": [0.2], "mode": ["top"], "seed": [0]}}


class Processes:
    """Started processes and, at teardown, every descendant of theirs: all are ended by pid."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, args: list[str], log: Path, **kwargs) -> subprocess.Popen:
        with open(log, "ab") as handle:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
        self.started.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace: float = 20.0) -> None:
        family = [proc.pid] + _descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        for pid in family:  # what ignored SIGTERM, and what lives in other sessions (Ray's job drivers)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
        if proc in self.started:
            self.started.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.started)):
            self.stop(proc)


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    # Short: Ray puts unix sockets under its temp dir, and socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="gmts-it-", dir="/tmp"))
    yield path
    if not os.environ.get("GMTS_IT_KEEP"):  # set it to look at the logs after a failure
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture(scope="module")
def ray_head(work: Path, processes: Processes) -> Iterator[str]:
    """``ray start --head`` on loopback with RAY_AUTH_MODE=token; yields the Jobs API URL."""
    dashboard = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_", "MLFLOW_", "GMTS_"))}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN, PATH=f"{VENV_BIN}:{env['PATH']}",
               RAY_USAGE_STATS_ENABLED="0")
    ports = {flag: str(free_port()) for flag in ("--port", "--ray-client-server-port", "--dashboard-agent-listen-port",
                                                 "--dashboard-agent-grpc-port", "--metrics-export-port",
                                                 "--runtime-env-agent-port", "--node-manager-port",
                                                 "--object-manager-port")}
    args = [str(VENV_BIN / "ray"), "start", "--head", "--block", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard), "--include-dashboard", "true",
            "--temp-dir", str(work / "ray"), "--disable-usage-stats", *[x for pair in ports.items() for x in pair]]
    # The job's working directory is the head's: start it in the repository, like a user would.
    proc = processes.start(args, work / "ray-head.log", env=env, cwd=REPO)
    url = f"http://127.0.0.1:{dashboard}"

    def up() -> bool:
        assert proc.poll() is None, (work / "ray-head.log").read_text()[-3000:]
        try:
            return httpx.get(f"{url}/api/version", headers=bearer(TOKEN), timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 180, what="the Ray head")
    yield url
    _stop_every_job(url)
    processes.stop(proc)


def _stop_every_job(url: str) -> None:
    from ray.job_submission import JobSubmissionClient

    try:
        client = JobSubmissionClient(url, headers=bearer(TOKEN))
        for job in client.list_jobs():
            if not job.status.is_terminal():
                client.stop_job(job.submission_id)
    except Exception as exc:  # noqa: BLE001 - teardown: killing the processes is what guarantees the end
        print(f"could not stop the jobs through the Jobs API ({exc}); killing the processes")


@pytest.fixture(scope="module")
def mlflow_server(work: Path, processes: Processes) -> Iterator[str]:
    port = free_port()
    args = [str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}",
            "--default-artifact-root", str(work / "mlartifacts"), "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1"]
    proc = processes.start(args, work / "mlflow.log", env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, (work / "mlflow.log").read_text()[-3000:]
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 240, what="the MLflow server")
    yield url
    processes.stop(proc)


class ApiProcess:
    """``gmts serve`` (python -m api.cli serve) with GMTS_* settings; restartable."""

    def __init__(self, work: Path, processes: Processes, ray_url: str, mlflow_url: str) -> None:
        self.work, self.processes = work, processes
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (work / "roots").mkdir(exist_ok=True)
        token_file = work / "ray-token"
        token_file.write_text(TOKEN)
        api_token_file = work / "api-token"
        api_token_file.write_text(TOKEN)
        # Nothing of Ray's own auth variables: the service must pass the token itself (GMTS_RAY_AUTH_TOKEN_FILE).
        env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_", "MLFLOW_", "GMTS_"))}
        self.env = {**env, "GMTS_API_TOKEN_FILE": str(api_token_file), "GMTS_STATE_DIR": str(work / "state"),
                    "GMTS_ALLOWED_ROOTS": f"{work / 'roots'}:{Path('~/.cache/gmts-lab').expanduser()}",
                    "GMTS_RAY_ADDRESS": ray_url, "GMTS_RAY_AUTH_TOKEN_FILE": str(token_file),
                    "GMTS_MLFLOW_TRACKING_URI": mlflow_url, "GMTS_CANCEL_WAIT_S": "90", "GMTS_PORT": str(self.port)}
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = self.processes.start([sys.executable, "-m", "api.cli", "serve"], self.work / "api.log",
                                         env=self.env, cwd=REPO)

        def up() -> bool:
            assert self.proc.poll() is None, (self.work / "api.log").read_text()[-3000:]
            try:
                return httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 180, what="the API")

    def stop(self) -> None:
        self.processes.stop(self.proc)

    def call(self, method: str, path: str, **kwargs) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", headers={**bearer(TOKEN), **kwargs.pop("headers", {})},
                             timeout=120, **kwargs)


@pytest.fixture(scope="module")
def api(work: Path, processes: Processes, ray_head: str, mlflow_server: str) -> Iterator[ApiProcess]:
    server = ApiProcess(work, processes, ray_head, mlflow_server)
    server.start()
    yield server
    server.stop()


def _ray_status(ray_url: str, submission_id: str) -> str:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(ray_url, headers=bearer(TOKEN)).get_job_status(submission_id).value


def _status(api: ApiProcess, sweep_id: str) -> dict:
    response = api.call("GET", f"/v1/sweeps/{sweep_id}")
    assert response.status_code == 200, response.text
    return response.json()


def test_sweeps_over_rest_against_real_ray_and_mlflow(api: ApiProcess, ray_head: str, mlflow_server: str,
                                                      work: Path) -> None:
    timings: dict[str, float] = {}
    started = time.monotonic()
    assert api.call("GET", "/readyz").json() == {"ready": True, "ray": "ok", "mlflow": "ok"}
    assert httpx.get(f"{ray_head}/api/jobs/", timeout=10).status_code == 401  # the cluster really wants a token
    assert api.call("GET", "/v1/sweeps", headers=bearer("not-the-token-at-all")).status_code == 401

    # 1. submit
    response = api.call("POST", "/v1/sweeps", json=_sweep("it-first"), headers={"Idempotency-Key": "it-first"})
    assert response.status_code == 201, response.text
    first = response.json()
    assert api.call("POST", "/v1/sweeps", json=_sweep("it-first"), headers={"Idempotency-Key": "it-first"}).json()["id"] == first["id"]
    wait_for(lambda: _status(api, first["id"])["status"] == "running", 300, 2, "the first sweep to run")
    timings["submit→running"] = time.monotonic() - started

    # 2. restart the API mid-sweep: the new process reports what Ray reports
    api.stop()
    api.start()
    after_restart = _status(api, first["id"])
    ray_now = _ray_status(ray_head, first["ray_submission_id"])
    assert after_restart["status"] == {"RUNNING": "running", "SUCCEEDED": "succeeded"}[ray_now], (after_restart, ray_now)
    timings["restart"] = time.monotonic() - started

    # 3. a second sweep, cancelled while it waits behind the first (both trials need the 2 CPUs)
    second = api.call("POST", "/v1/sweeps", json=_sweep("it-second")).json()
    wait_for(lambda: _status(api, second["id"])["mlflow"]["run_id"], 300, 2, "the second sweep's parent run")
    response = api.call("POST", f"/v1/sweeps/{second['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"
    assert _ray_status(ray_head, second["ray_submission_id"]) == "STOPPED"
    mlflow = MlflowClient(mlflow_server)
    parent = mlflow.get_run(response.json()["mlflow"]["run_id"])
    assert parent.info.status == "KILLED"
    children = mlflow.search_runs([parent.info.experiment_id], f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    assert all(child.info.status in ("KILLED", "FINISHED") for child in children), [c.info.status for c in children]
    timings["cancel"] = time.monotonic() - started

    # 4. the first sweep succeeds; its results are the report's, straight from MLflow
    final = wait_for(lambda: (s := _status(api, first["id"]))["status"] in ("succeeded", "failed", "cancelled") and s,
                     1500, 5, "the first sweep to finish")
    timings["finished"] = time.monotonic() - started
    logs = api.call("GET", f"/v1/sweeps/{first['id']}/logs", params={"tail": 50}).json()
    assert final["status"] == "succeeded", "\n".join(logs["lines"])
    assert _ray_status(ray_head, first["ray_submission_id"]) == "SUCCEEDED"
    parent_id = final["mlflow"]["run_id"]
    children = mlflow.search_runs([mlflow.get_run(parent_id).info.experiment_id], f"tags.`{PARENT_TAG}` = '{parent_id}'")
    assert final["trials"] == {"total": 2, "running": 0, "finished": 2, "failed": 0, "killed": 0}, (
        final, [(c.info.run_id, c.info.status, c.data.tags.get("gmts.trial")) for c in children])
    assert {child.data.tags[API_ID_TAG] for child in children} == {first["id"]}
    assert not [c for c in children if c.info.status == "RUNNING"]  # attempts Tune restarted are closed
    results = api.call("GET", f"/v1/sweeps/{first['id']}/results")
    assert results.status_code == 200, results.text
    assert results.json()["parent_run_id"] == parent_id
    assert results.json()["results"] == ablation_results(mlflow_server, parent_id)
    assert logs["lines"]
    listed = {item["id"]: item["status"] for item in api.call("GET", "/v1/sweeps").json()["items"]}
    assert listed == {first["id"]: "succeeded", second["id"]: "cancelled"}
    print("timings (s since the first submit):", {k: round(v) for k, v in timings.items()})


def test_training_run_through_ray_job_submit_lands_in_mlflow(ray_head: str, mlflow_server: str, work: Path) -> None:
    """What a user types: ``ray job submit --working-dir . -- python -m orchestrator.train …`` against the
    token-auth head; the job succeeds and its run, with the config as params, is in the MLflow server."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_", "MLFLOW_", "GMTS_"))}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN, PATH=f"{VENV_BIN}:{env['PATH']}")
    run_name = "job-submit-" + secrets.token_hex(4)
    overrides = {**TINY_OVERRIDES, "training.steps": 2, "name": run_name, "tracking.tracking_uri": mlflow_server,
                 "output_dir": str(work / "job-runs")}
    command = [str(VENV_BIN / "ray"), "job", "submit", "--address", ray_head, "--working-dir", ".",
               "--submission-id", run_name, "--", "python", "-m", "orchestrator.train", "--config", "cpu-tiny-s",
               *[arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert _ray_status(ray_head, run_name) == "SUCCEEDED"
    mlflow = MlflowClient(mlflow_server)
    runs = mlflow.search_runs(
        [mlflow.get_experiment_by_name("gmts-lab").experiment_id], f"tags.`mlflow.runName` = '{run_name}'")
    assert [run.info.status for run in runs] == ["FINISHED"], runs
    run = runs[0]
    assert run.data.params["selection.method"] == "gmts" and run.data.params["training.steps"] == "2"
    assert [m.step for m in mlflow.get_metric_history(run.info.run_id, "train/accuracy")] == [1, 2]
    assert "eval/arithmetic/accuracy" in run.data.metrics


def _job_processes(job_file: str) -> list[int]:
    """Every process on this machine whose command line names the job's file (driver, its shell)."""
    return [p.pid for p in psutil.process_iter(["cmdline"]) if job_file in (p.info.get("cmdline") or [])]


def _assert_gone(api: ApiProcess, ray_head: str, mlflow_server: str, run: dict, ray_job_id: str | None) -> None:
    ray_jobs = RayJobs(ray_head, TOKEN)
    assert _ray_status(ray_head, run["ray_submission_id"]) == "STOPPED"
    job_file = str(api.work / "state" / "jobs" / f"{run['id']}.yaml")
    assert _job_processes(job_file) == []
    state = ray_jobs.state(run["ray_submission_id"])
    job_id = ray_job_id or state.job_id
    if job_id:  # None: no driver ever registered with Ray
        # Ray's own bookkeeping of dead actors lags their death by a moment
        wait_for(lambda: ray_jobs.live_processes(job_id, state.driver_pid) == [], 30, 1, "Ray to list nothing alive")
    mlflow = MlflowClient(mlflow_server)
    experiment = mlflow.get_experiment_by_name("gmts-lab")
    runs = mlflow.search_runs([experiment.experiment_id], f"tags.`{API_ID_TAG}` = '{run['id']}'") if experiment else []
    assert all(r.info.status == "KILLED" for r in runs), [(r.info.run_id, r.info.status) for r in runs]
    return runs


def test_cancel_leaves_nothing_running_at_any_point_of_a_job(api: ApiProcess, ray_head: str, mlflow_server: str) -> None:
    ray_jobs = RayJobs(ray_head, TOKEN)
    body = {"preset": "cpu-tiny-s", "overrides": {**TINY_OVERRIDES, "training.steps": 200}}
    timings = {}

    # (a) queued / starting: the cancel follows the submit at once (where Ray said STOPPED and the driver went on)
    started = time.monotonic()
    run = api.call("POST", "/v1/runs", json=body).json()
    response = api.call("POST", f"/v1/runs/{run['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"
    time.sleep(5)  # a driver that starts late would be up by now
    _assert_gone(api, ray_head, mlflow_server, run, None)
    timings["starting"] = time.monotonic() - started

    # (b) training: its MLflow run is open and its actors are alive
    started = time.monotonic()
    run = api.call("POST", "/v1/runs", json=body).json()
    mlflow = MlflowClient(mlflow_server)

    def training() -> str | None:
        state = ray_jobs.state(run["ray_submission_id"])
        experiment = mlflow.get_experiment_by_name("gmts-lab")
        if not state.job_id or experiment is None:
            return None
        runs = mlflow.search_runs([experiment.experiment_id], f"tags.`{API_ID_TAG}` = '{run['id']}'")
        actors = [p for p in ray_jobs.live_processes(state.job_id, state.driver_pid)
                  if p.kind == "actor" and p.state == "ALIVE"]
        return state.job_id if runs and runs[0].info.status == "RUNNING" and actors else None

    job_id = wait_for(training, 600, 2, "the run to train with live actors")
    response = api.call("POST", f"/v1/runs/{run['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"
    runs = _assert_gone(api, ray_head, mlflow_server, run, job_id)
    assert len(runs) == 1
    timings["training"] = time.monotonic() - started
    print("cancel timings (s):", {k: round(v) for k, v in timings.items()})
