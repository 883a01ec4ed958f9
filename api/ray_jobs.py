"""The Ray Jobs API, as the control plane uses it: submit, status, stop, logs.

Ray token authentication (``RAY_AUTH_MODE=token``, Ray ≥ 2.52): the dashboard's HTTP API wants
``Authorization: Bearer <token>``. ``JobSubmissionClient`` adds that header by itself only when *this*
process runs with ``RAY_AUTH_MODE=token`` (it then reads ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token``); a header passed in ``headers=`` always wins. We pass the token explicitly
when the settings hold one (``GMTS_RAY_AUTH_TOKEN[_FILE]``), so that the service works whatever its
own environment says, and fall back to Ray's lookup otherwise. The token never goes into a job's
runtime_env (the dashboard shows runtime_envs to anyone who can list jobs); the job's driver
inherits it from the cluster it runs on.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote

logger = logging.getLogger(__name__)

# Ray's JobStatus → ours. STOPPED is what stop_job leads to.
RAY_TO_STATUS = {
    "PENDING": "pending",
    "RUNNING": "running",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "STOPPED": "cancelled",
}


class RayUnavailable(Exception):
    """Ray's Jobs API could not be reached or refused our credentials."""


class RayRefused(RayUnavailable):
    """Ray's Jobs API answered, but refused our credentials (401: no token, 403: a wrong one)."""

    def __init__(self, message: str, token_sent: bool) -> None:
        super().__init__(message)
        self.token_sent = token_sent


class JobNotFound(Exception):
    """Ray has no job with this submission id (never submitted, or the cluster was replaced)."""


@dataclass(frozen=True)
class JobState:
    status: str  # Ray's JobStatus name
    message: str
    job_id: str | None = None  # the driver's Ray JobID (hex), once a driver registered
    driver_pid: int | None = None


@dataclass(frozen=True)
class LiveProcess:
    """A process of a job that Ray's state API says is not dead: its driver or one of its actors."""

    kind: str  # "driver" or "actor"
    ray_id: str  # worker id of a driver, actor id of an actor
    name: str  # an actor's class name ("" for a driver)
    state: str
    pid: int | None
    node_id: str | None

    def describe(self) -> str:
        what = f"actor {self.name or self.ray_id[:12]}" if self.kind == "actor" else "driver"
        return f"{what} (pid {self.pid}, {self.state})"


# Run first in every worker process of a job: what the job writes is owner-only (api/job.py).
WORKER_SETUP_HOOK = "api.job.owner_only_files"

# Actor states in which an actor still holds (or is about to hold) a process and its resources.
LIVE_ACTOR_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING")


class JobsBackend(Protocol):
    """What the service needs from Ray; tests/api uses a fake of it for the fast tests."""

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str], metadata: dict[str, str]) -> None: ...
    def state(self, submission_id: str) -> JobState: ...
    def states(self) -> dict[str, JobState]: ...
    def stop(self, submission_id: str) -> None: ...
    def logs(self, submission_id: str) -> str: ...
    def ping(self) -> str: ...
    def live_processes(self, job_id: str, driver_pid: int | None = None) -> list[LiveProcess]: ...


class RayJobs:
    """JobSubmissionClient behind a lock, created on first use and again after a failure."""

    def __init__(self, address: str, token: str | None) -> None:
        self.address = address
        self._headers = {"Authorization": f"Bearer {token}"} if token else None
        self._client = None
        self._lock = threading.Lock()

    def _call(self, method: str, *args, **kwargs):
        from ray.exceptions import AuthenticationError
        from ray.job_submission import JobSubmissionClient

        try:
            with self._lock:
                if self._client is None:
                    self._client = JobSubmissionClient(self.address, headers=self._headers)
                client = self._client
            return getattr(client, method)(*args, **kwargs)
        except AuthenticationError as exc:
            self._client = None
            # Ray says "Authentication required" for a 401 (no token came) and "… failed" for a 403.
            token_sent = not str(exc).startswith("Authentication required")
            raise RayRefused(f"Ray at {self.address} refused our token: {str(exc).splitlines()[0]}", token_sent) from None
        except OSError as exc:  # requests' and the client's ConnectionError are both OSErrors
            self._client = None
            raise RayUnavailable(f"Ray Jobs API at {self.address} is unreachable ({type(exc).__name__})") from None
        except RuntimeError as exc:
            if "status code 404" in str(exc) or "does not exist" in str(exc):
                raise JobNotFound(args[0] if args else kwargs.get("submission_id", "?")) from None
            raise

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str], metadata: dict[str, str]) -> None:
        self._call(
            "submit_job",
            entrypoint=entrypoint,
            submission_id=submission_id,
            runtime_env={"env_vars": env_vars, "worker_process_setup_hook": WORKER_SETUP_HOOK},
            metadata=metadata,
        )

    def state(self, submission_id: str) -> JobState:
        return _job_state(self._call("get_job_info", submission_id))

    def states(self) -> dict[str, JobState]:
        return {job.submission_id: _job_state(job) for job in self._call("list_jobs") if job.submission_id}

    def live_processes(self, job_id: str, driver_pid: int | None = None) -> list[LiveProcess]:
        """The job's driver and actors that Ray's state API does not list as dead (cluster-wide).
        Workers are not filterable by job, so the driver is looked up by the pid Ray's job info gives."""
        live = []
        if driver_pid:
            drivers = self._state_rows("workers", ("pid", "=", str(driver_pid)), ("is_alive", "=", "True"),
                                       ("worker_type", "=", "DRIVER"))
            live += [LiveProcess("driver", row.get("worker_id", ""), "", "ALIVE", row.get("pid"), row.get("node_id"))
                     for row in drivers]
        for row in self._state_rows("actors", ("job_id", "=", job_id)):
            if row.get("state") in LIVE_ACTOR_STATES:
                live.append(LiveProcess("actor", row.get("actor_id", ""), row.get("class_name") or "",
                                        row["state"], row.get("pid"), row.get("node_id")))
        return live

    def _state_rows(self, resource: str, *filters: tuple[str, str, str]) -> list[dict]:
        # The dashboard's state API over HTTP, through the Jobs client so that it carries the same
        # auth header (Ray's own StateApiClient does the same: it is a SubmissionClient too).
        params = [("limit", "10000"), ("timeout", "10"), ("detail", "false")]
        for key, predicate, value in filters:
            params += [("filter_keys", key), ("filter_predicates", predicate), ("filter_values", value)]
        query = "&".join(f"{key}={quote(value)}" for key, value in params)
        response = self._call("_do_request", "GET", f"/api/v0/{resource}?{query}", timeout=30)
        if response.status_code != 200:
            raise RayUnavailable(f"Ray's state API ({resource}) answered {response.status_code}: {response.text[:200]}")
        body = response.json()
        return (((body.get("data") or {}).get("result") or {}).get("result")) or []

    def stop(self, submission_id: str) -> None:
        self._call("stop_job", submission_id)

    def logs(self, submission_id: str) -> str:
        return self._call("get_job_logs", submission_id)

    def ping(self) -> str:
        self._call("list_jobs")
        return "ok"


def _job_state(info) -> JobState:
    driver = getattr(info, "driver_info", None)
    pid = getattr(driver, "pid", None)
    return JobState(status=str(info.status.value), message=info.message or "", job_id=getattr(info, "job_id", None),
                    driver_pid=int(pid) if pid and str(pid).isdigit() else None)
