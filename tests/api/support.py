"""Helpers of the API tests: a fake Ray Jobs backend for the fast tests, a uvicorn runner, bodies."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import uvicorn
import yaml

from api.ray_jobs import JobNotFound, JobState, LiveProcess, RayUnavailable

TOKEN = "test-token-0123456789abcdef"


class FakeJobs:
    """In-memory stand-in for the Ray Jobs API: records what would be submitted; tests set states."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict] = {}
        self.live = {}
        self.available = True
        self.stop_takes_effect = True
        self.refuse = False  # True: Ray answers submissions with an error (as JobSubmissionClient raises it)  # False: stop is requested but the job keeps running

    def _check(self) -> None:
        if not self.available:
            raise RayUnavailable("fake Ray is down")

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str], metadata: dict[str, str]) -> None:
        self._check()
        if self.refuse:
            raise RuntimeError("Request failed with status code 500: runtime_env setup failed.")
        assert submission_id not in self.jobs, "Ray refuses a duplicate submission id"
        self.jobs[submission_id] = {"entrypoint": entrypoint, "env_vars": env_vars, "metadata": metadata,
                                    "status": "PENDING", "message": "", "logs": ""}

    def set(self, submission_id: str, status: str, message: str = "", logs: str | None = None) -> None:
        self.jobs[submission_id].update(status=status, message=message)
        if logs is not None:
            self.jobs[submission_id]["logs"] = logs

    def state(self, submission_id: str) -> JobState:
        self._check()
        if submission_id not in self.jobs:
            raise JobNotFound(submission_id)
        job = self.jobs[submission_id]
        return JobState(job["status"], job["message"], job_id=job.get("job_id"))

    def states(self) -> dict[str, JobState]:
        self._check()
        return {sid: JobState(job["status"], job["message"], job_id=job.get("job_id")) for sid, job in self.jobs.items()}

    def stop(self, submission_id: str) -> None:
        self._check()
        if submission_id not in self.jobs:
            raise JobNotFound(submission_id)
        if self.stop_takes_effect and self.jobs[submission_id]["status"] in ("PENDING", "RUNNING"):
            self.set(submission_id, "STOPPED", "Job was intentionally stopped.")

    def logs(self, submission_id: str) -> str:
        self._check()
        if submission_id not in self.jobs:
            raise JobNotFound(submission_id)
        return self.jobs[submission_id]["logs"]

    def ping(self) -> str:
        self._check()
        return "ok"

    # What Ray's state API lists as alive of a job: tests put LiveProcess rows here by Ray JobID.
    live: dict[str, list[LiveProcess]]

    def live_processes(self, job_id: str, driver_pid: int | None = None) -> list[LiveProcess]:
        self._check()
        return list(self.live.get(job_id, []))


class serve:
    """Run an ASGI app under uvicorn in a thread, on 127.0.0.1; stopped on exit."""

    def __init__(self, app, port: int | None = None) -> None:
        self.port = port or free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sweep_body(**fields) -> dict:
    """A small valid sweep on the shipped cpu-tiny-s preset: ETS vs GMTS at 20 % plus the baseline."""
    return {
        "name": "api-test",
        "base": {"preset": "cpu-tiny-s", "overrides": {"training.steps": 1}},
        "grid": {"method": ["none", "ets", "gmts"], "ratio": [0.2]},
        **fields,
    }


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}

