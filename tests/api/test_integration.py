"""End to end over real components, loopback only: a Ray head started with token authentication, an
``mlflow server`` (SQLite), and the API as a ``gmts serve`` process.

1. a tiny two-trial sweep (ETS vs GMTS at 20 %, one RL step each) is submitted over HTTP;
2. once it runs, the API process is restarted: the new one reports the status Ray reports;
3. a second sweep is submitted and cancelled while it waits behind the first: Ray says STOPPED, MLflow
   says KILLED;
4. the first sweep is polled to success and its results equal ``sweeps.report.ablation_results`` read
   straight from MLflow;
5. jobs are cancelled at every point of their life — a run right after submit (queued/starting),
   during its supervised warm-up (its MLflow run open, no actors yet), while training (actors up),
   and a sweep while it writes its report (trials finished, parent run closed): each time Ray says
   STOPPED, no process of the job is left on the machine, Ray's state API lists no live driver or
   actor of it, and its MLflow runs are KILLED (the reporting sweep: its parent KILLED, its finished
   trials FINISHED);
6. a training run submitted with ``ray job submit`` but no tracking URI refuses to log into Ray's
   temporary working-dir copy, naming MLFLOW_TRACKING_URI;
7. the node that holds a running sweep's driver — the head, where Ray Jobs runs drivers — is lost (every process
   of it killed at once): the API says on the sweep that Ray does not answer; a new head comes up, and the sweep
   is failed with a message naming its resume call; resumed through the API, it finishes from its own files.

One Ray head, MLflow server and API process serve the whole module; the three start side by side.

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
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from api.app import create_app
from api.ray_jobs import RayJobs
from api.settings import ApiSettings
from api.tracking_view import API_ID_TAG
from sweeps.parent_run import PARENT_TAG
from sweeps.report import ablation_results
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


def _sweep(name: str, methods: tuple[str, ...] = ("ets", "gmts")) -> dict:
    return {"name": name, "base": {"preset": "cpu-tiny-s", "overrides": TINY_OVERRIDES},
            "grid": {"method": list(methods), "ratio": [0.2], "mode": ["top"], "seed": [0]}}


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
        self.stop_together([proc], grace)

    def stop_all(self) -> None:
        self.stop_together(list(reversed(self.started)))

    def stop_together(self, procs: list[subprocess.Popen], grace: float = 20.0) -> None:
        """SIGTERM to each process group, one grace period for all, then SIGKILL to what is left and to
        every descendant recorded before (what ignored SIGTERM, and what lives in other sessions: Ray's
        job drivers)."""
        families = {proc.pid: [proc.pid] + _descendants(proc.pid) for proc in procs}
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            for pid in families[proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)
            if proc in self.started:
                self.started.remove(proc)


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


class Stack:
    """The Ray head, the MLflow server and ``gmts serve``, launched side by side: each start is seconds
    to a minute of imports on this machine, and run one after another they cost the sum."""

    def __init__(self, work: Path, processes: Processes) -> None:
        self.work, self.processes = work, processes
        self.ray_url = f"http://127.0.0.1:{free_port()}"
        self.mlflow_url = f"http://127.0.0.1:{free_port()}"
        self.ray: subprocess.Popen | None = None
        self.mlflow: subprocess.Popen | None = None
        self.api = ApiProcess(work, processes, self.ray_url, self.mlflow_url)

    def start(self) -> None:
        self.mlflow = self._launch_mlflow()
        self.ray = self._launch_ray(attempt=0)
        self.api.launch()  # it reaches Ray and MLflow lazily: it may load while they start
        self._wait_ray()
        self._wait_mlflow()
        self.api.wait_ready()

    def stop(self) -> None:
        if self.ray is not None:
            _stop_every_job(self.ray_url)
        # Every job is stopped and nothing of the stack is read after this: what has not ended in 5 s is killed
        # (with the 20 s default the module's teardown took 20 s: one of them outlives SIGTERM).
        self.processes.stop_together([p for p in (self.api.proc, self.ray, self.mlflow) if p is not None], grace=5.0)
        self.api.proc = None

    def _launch_ray(self, attempt: int) -> subprocess.Popen:
        """``ray start --head`` on loopback with RAY_AUTH_MODE=token."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_", "MLFLOW_", "GMTS_"))}
        # TMPDIR inside the module's folder, as `gmts up` does: the dashboard's forkserver leaves its pymp-* there.
        scratch = self.work / "tmp"
        scratch.mkdir(mode=0o700, exist_ok=True)
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN, PATH=f"{VENV_BIN}:{env['PATH']}",
                   RAY_USAGE_STATS_ENABLED="0", TMPDIR=str(scratch))
        ports = {flag: str(free_port()) for flag in ("--port", "--ray-client-server-port",
                                                     "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                                     "--metrics-export-port", "--runtime-env-agent-port",
                                                     "--node-manager-port", "--object-manager-port")}
        args = [str(VENV_BIN / "ray"), "start", "--head", "--block", "--num-cpus", "2", "--node-ip-address",
                "127.0.0.1", "--dashboard-host", "127.0.0.1", "--dashboard-port", self.ray_url.rsplit(":", 1)[1],
                "--include-dashboard", "true", "--temp-dir", str(self.work / "ray"), "--disable-usage-stats",
                *[x for pair in ports.items() for x in pair]]
        # The job's working directory is the head's: start it in the repository, like a user would.
        return self.processes.start(args, self.work / f"ray-head-{attempt}.log", env=env, cwd=REPO)

    def lose_ray(self) -> None:
        """The head's machine lost: SIGKILL to the head and every process under it at once (its raylet, GCS,
        dashboard, workers and the job drivers Ray started in sessions of their own), no stop of any kind."""
        pids = [self.ray.pid, *_descendants(self.ray.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.ray.wait(timeout=30)
        self.processes.started.remove(self.ray)
        wait_for(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                                 for pid in pids), 30, what="the lost head's processes to be gone")

    def new_ray(self, first_attempt: int) -> None:
        """A new head on the same Jobs API address (as a recreated cluster behind the same service name)."""
        self.ray = self._launch_ray(attempt=first_attempt)
        self._wait_ray(first_attempt)

    def _wait_ray(self, first_attempt: int = 0) -> None:
        # On a loaded machine the raylet may miss Ray's fixed 30 s registration window ("The current node
        # timed out during startup") after the dashboard already answered: the head is up only once `ray
        # start` says "Ray runtime started"; a head that died starting is started again (3 tries).
        for attempt in range(first_attempt, first_attempt + 3):
            proc, log = self.ray, self.work / f"ray-head-{attempt}.log"

            def up() -> bool:
                if proc.poll() is not None:
                    return True  # died: judged below
                try:
                    answers = httpx.get(f"{self.ray_url}/api/version", headers=bearer(TOKEN), timeout=5).status_code == 200
                except httpx.HTTPError:
                    return False
                return answers and "Ray runtime started" in log.read_text()

            wait_for(up, 300, what="the Ray head")
            if proc.poll() is None:
                return
            self.processes.stop(proc)
            assert attempt < first_attempt + 2, log.read_text()[-3000:]
            self.ray = self._launch_ray(attempt + 1)

    def _launch_mlflow(self) -> subprocess.Popen:
        args = [str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{self.work / 'mlflow.db'}",
                "--default-artifact-root", str(self.work / "mlartifacts"), "--host", "127.0.0.1", "--port",
                self.mlflow_url.rsplit(":", 1)[1], "--workers", "1"]
        return self.processes.start(args, self.work / "mlflow.log",  # no job runner, as the local stack
                                    env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
                                         "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})

    def _wait_mlflow(self) -> None:
        def up() -> bool:
            assert self.mlflow.poll() is None, (self.work / "mlflow.log").read_text()[-3000:]
            try:
                return httpx.get(f"{self.mlflow_url}/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 240, what="the MLflow server")


def _stop_every_job(url: str) -> None:
    from ray.job_submission import JobSubmissionClient

    try:
        client = JobSubmissionClient(url, headers=bearer(TOKEN))
        for job in client.list_jobs():
            if not job.status.is_terminal():
                client.stop_job(job.submission_id)
    except Exception as exc:  # noqa: BLE001 - teardown: killing the processes is what guarantees the end
        print(f"could not stop the jobs through the Jobs API ({exc}); killing the processes")


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
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        self.proc = self.processes.start([sys.executable, "-m", "api.cli", "serve"], self.work / "api.log",
                                         env=self.env, cwd=REPO)

    def wait_ready(self) -> None:
        def up() -> bool:
            assert self.proc.poll() is None, (self.work / "api.log").read_text()[-3000:]
            try:  # /healthz answers at once (api/deferred.py); /readyz once the app is loaded
                return httpx.get(f"{self.url}/readyz", timeout=30).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 600, what="the API")

    def stop(self) -> None:
        self.processes.stop(self.proc)
        self.proc = None

    def call(self, method: str, path: str, **kwargs) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", headers={**bearer(TOKEN), **kwargs.pop("headers", {})},
                             timeout=120, **kwargs)


@pytest.fixture(scope="module")
def stack(work: Path, processes: Processes) -> Iterator[Stack]:
    services = Stack(work, processes)
    try:
        services.start()
        yield services
    finally:
        services.stop()


@pytest.fixture(scope="module")
def ray_head(stack: Stack) -> str:
    """The Jobs API URL of a head started with token authentication."""
    return stack.ray_url


@pytest.fixture(scope="module")
def mlflow_server(stack: Stack) -> str:
    return stack.mlflow_url


@pytest.fixture(scope="module")
def api(stack: Stack) -> ApiProcess:
    return stack.api


def _modes(folder: Path) -> dict[str, str]:
    """Every folder and file under ``folder`` (itself too; links not followed) → its permission bits."""
    return {str(path.relative_to(folder)): oct(path.lstat().st_mode & 0o777)
            for path in [folder, *folder.rglob("*")] if not path.is_symlink()}


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
    # A service holding a wrong Ray token: Ray answers, so /readyz says refused, not unreachable.
    wrong = ApiSettings(api_token=TOKEN, state_dir=work / "wrong-ray-token", ray_address=ray_head,
                        ray_auth_token="not-the-cluster-token-" + secrets.token_hex(8), mlflow_tracking_uri=mlflow_server)
    with TestClient(create_app(wrong)) as anonymous:
        ready = anonymous.get("/readyz")
    assert ready.status_code == 503 and ready.json()["ray"].startswith("refused: the Ray cluster rejected the token")

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
    ray_now = {"RUNNING": "running", "SUCCEEDED": "succeeded"}[_ray_status(ray_head, first["ray_submission_id"])]
    # reads serve the reconciler's rows; its first pass starts with the process
    wait_for(lambda: _status(api, first["id"])["status"] in (ray_now, "succeeded"), 30, 1, "the status Ray reports")
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
    # Owner-only all through: the state the service wrote and what the job wrote under runs/<id>/ — its
    # driver (sweep.json, the report) and its Ray workers (each trial's run folder and files) alike.
    outputs = _modes(work / "state" / "runs" / first["id"])
    trial_files = [name for name in outputs if name.endswith("-t000/base_reference.pt")]  # written in the trial
    assert f"{first['id']}/sweep.json" in outputs and trial_files, sorted(outputs)
    assert {name: mode for name, mode in _modes(work / "state").items() if mode not in ("0o700", "0o600")} == {}
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


def _assert_gone(api: ApiProcess, ray_head: str, mlflow_server: str, run: dict, ray_job_id: str | None,
                 finished: tuple[str, ...] = ()) -> list:
    """Nothing of the job is left; its MLflow runs are KILLED (but the ids in ``finished``: FINISHED)."""
    ray_jobs = RayJobs(ray_head, TOKEN)
    assert _ray_status(ray_head, run["ray_submission_id"]) == "STOPPED"
    kind = "sweep" if run["id"].startswith("sw-") else "run"
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
    expected = {r.info.run_id: "FINISHED" if r.info.run_id in finished else "KILLED" for r in runs}
    assert {r.info.run_id: r.info.status for r in runs} == expected, kind
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

    # (b) training, rolling out ahead: its MLflow run is open, its actors are alive and it has trained a batch
    # collected one version behind, so the engines are collecting the next batch beside the update when the
    # cancel comes; both sides must stop
    started = time.monotonic()
    ahead = {**body["overrides"], "rollout.max_staleness": 1, "learner.old_logp_source": "rollout"}
    run = api.call("POST", "/v1/runs", json={"preset": "cpu-tiny-s", "overrides": ahead}).json()
    mlflow = MlflowClient(mlflow_server)

    def training() -> str | None:
        state = ray_jobs.state(run["ray_submission_id"])
        experiment = mlflow.get_experiment_by_name("gmts-lab")
        if not state.job_id or experiment is None:
            return None
        runs = mlflow.search_runs([experiment.experiment_id], f"tags.`{API_ID_TAG}` = '{run['id']}'")
        if not runs or runs[0].info.status != "RUNNING" or runs[0].data.metrics.get("rollout/staleness") != 1:
            return None
        actors = [p for p in ray_jobs.live_processes(state.job_id, state.driver_pid)
                  if p.kind == "actor" and p.state == "ALIVE"]
        return state.job_id if actors else None

    job_id = wait_for(training, 600, 2, "the run to train a stale batch with live actors")
    response = api.call("POST", f"/v1/runs/{run['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"
    runs = _assert_gone(api, ray_head, mlflow_server, run, job_id)
    assert len(runs) == 1
    timings["training"] = time.monotonic() - started

    # (c) warm-up: a base policy that is not cached (its own warm-up seed) trains in the driver; the
    # MLflow run is already open, no actor is up yet
    started = time.monotonic()
    warm = {**body["overrides"], "warmup.seed": secrets.randbelow(2**31), "warmup.steps": 5000}
    run = api.call("POST", "/v1/runs", json={"preset": "cpu-tiny-s", "overrides": warm}).json()

    def warming_up() -> bool:
        logs = api.call("GET", f"/v1/runs/{run['id']}/logs", params={"tail": 50})
        return logs.status_code == 200 and any("Supervised warm-up" in line for line in logs.json()["lines"])

    wait_for(warming_up, 600, 1, "the run's warm-up")
    response = api.call("POST", f"/v1/runs/{run['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"
    assert len(_assert_gone(api, ray_head, mlflow_server, run, None)) == 1
    timings["warm-up"] = time.monotonic() - started

    # (d) reporting: the sweep's trials finished and its parent run is closed; the driver builds the report
    started = time.monotonic()
    # One trial: the report phase follows the last trial, however many there were.
    sweep = api.call("POST", "/v1/sweeps", json=_sweep("it-report", methods=("gmts",))).json()
    experiment = None

    def reporting() -> str | None:
        nonlocal experiment
        experiment = experiment or mlflow.get_experiment_by_name("gmts-lab")
        tagged = mlflow.search_runs([experiment.experiment_id], f"tags.`gmts.sweep_id` = '{sweep['id']}'")
        parents = [r for r in tagged if PARENT_TAG not in r.data.tags]  # the trials carry the sweep id too
        if parents and parents[0].info.status == "FINISHED":
            assert _ray_status(ray_head, sweep["ray_submission_id"]) == "RUNNING", "missed the report phase"
            return parents[0].info.run_id
        return None

    parent_id = wait_for(reporting, 1200, 0.2, "the sweep's report phase")
    response = api.call("POST", f"/v1/sweeps/{sweep['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled" and response.json()["mlflow"]["run_id"] == parent_id
    children = mlflow.search_runs([experiment.experiment_id], f"tags.`{PARENT_TAG}` = '{parent_id}'")
    runs = _assert_gone(api, ray_head, mlflow_server, sweep, None, finished=tuple(c.info.run_id for c in children))
    assert len(children) == 1 and {r.info.run_id for r in runs} == {parent_id, *(c.info.run_id for c in children)}
    assert mlflow.get_run(parent_id).info.status == "KILLED"
    timings["reporting"] = time.monotonic() - started
    print("cancel timings (s):", {k: round(v) for k, v in timings.items()})


def test_ray_job_submit_without_a_tracking_uri_refuses_ray_s_temporary_copy(ray_head: str) -> None:
    """``ray job submit --working-dir .`` without MLFLOW_TRACKING_URI: the run would log into Ray's
    unpacked copy of the working dir; it refuses instead (exit 2), naming what to set."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_", "MLFLOW_", "GMTS_"))}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN, PATH=f"{VENV_BIN}:{env['PATH']}")
    name = "no-tracking-" + secrets.token_hex(4)
    command = [str(VENV_BIN / "ray"), "job", "submit", "--address", ray_head, "--working-dir", ".",
               "--submission-id", name, "--", "python", "-m", "orchestrator.train", "--config", "cpu-smoke"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode != 0 and _ray_status(ray_head, name) == "FAILED"
    logs = " ".join((done.stdout + done.stderr).split())
    assert "MLFLOW_TRACKING_URI is not set either" in logs and "runtime_resources/working_dir_files" in logs


def test_a_lost_head_fails_the_sweep_and_resume_finishes_it(stack: Stack, api: ApiProcess, ray_head: str,
                                                             mlflow_server: str, work: Path) -> None:
    """Runs last: it replaces the module's Ray head."""
    sweep = api.call("POST", "/v1/sweeps", json=_sweep("it-lost", methods=("gmts",))).json()
    tune_state = work / "state" / "runs" / sweep["id"] / "ray_results" / sweep["id"]
    # The trial runs (its MLflow run is open) and Tune has written the sweep's state: what --resume continues from.
    wait_for(lambda: _status(api, sweep["id"])["trials"]["running"] == 1 and any(tune_state.glob("experiment_state*")),
             600, 2, "the sweep's trial to run")
    stack.lose_ray()
    silent = wait_for(lambda: (s := _status(api, sweep["id"]))["message"].startswith("Ray unreachable since") and s,
                      60, 1, "the API to say that Ray does not answer")
    assert silent["status"] == "running"  # the last status Ray gave, and the message says so
    assert api.call("GET", "/readyz").json()["ray"].startswith("unreachable")

    stack.new_ray(first_attempt=10)
    lost = wait_for(lambda: (s := _status(api, sweep["id"]))["status"] == "failed" and s, 120, 1,
                    "the sweep to be failed once a new cluster answers without its job")
    assert "Ray has no job" in lost["message"] and f"/v1/sweeps/{sweep['id']}/resume" in lost["message"], lost
    resumed = api.call("POST", lost["links"]["resume"])
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["ray_submission_id"] == f"gmts-{sweep['id']}-resume-1"
    final = wait_for(lambda: (s := _status(api, sweep["id"]))["status"] in ("succeeded", "failed", "cancelled") and s,
                     900, 5, "the resumed sweep to finish")
    logs = api.call("GET", f"/v1/sweeps/{sweep['id']}/logs", params={"tail": 400}).json()["lines"]
    assert final["status"] == "succeeded", "\n".join(logs[-60:])
    assert any(f"resuming sweep {sweep['id']}" in line for line in logs), "\n".join(logs[-60:])
    assert final["trials"]["finished"] == 1 and final["mlflow"]["run_id"] == lost["mlflow"]["run_id"]
    assert MlflowClient(mlflow_server).get_run(final["mlflow"]["run_id"]).info.status == "FINISHED"
    results = api.call("GET", f"/v1/sweeps/{sweep['id']}/results").json()
    assert results["complete"] and results["results"], results
