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


class JobNotFound(Exception):
    """Ray has no job with this submission id (never submitted, or the cluster was replaced)."""


@dataclass(frozen=True)
class JobState:
    status: str  # Ray's JobStatus name
    message: str


class JobsBackend(Protocol):
    """What the service needs from Ray; tests/api uses a fake of it for the fast tests."""

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str], metadata: dict[str, str]) -> None: ...
    def state(self, submission_id: str) -> JobState: ...
    def states(self) -> dict[str, JobState]: ...
    def stop(self, submission_id: str) -> None: ...
    def logs(self, submission_id: str) -> str: ...
    def ping(self) -> str: ...


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
            raise RayUnavailable(f"Ray at {self.address} refused our token: {str(exc).splitlines()[0]}") from None
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
            runtime_env={"env_vars": env_vars},
            metadata=metadata,
        )

    def state(self, submission_id: str) -> JobState:
        info = self._call("get_job_info", submission_id)
        return JobState(status=str(info.status.value), message=info.message or "")

    def states(self) -> dict[str, JobState]:
        return {
            job.submission_id: JobState(status=str(job.status.value), message=job.message or "")
            for job in self._call("list_jobs")
            if job.submission_id
        }

    def stop(self, submission_id: str) -> None:
        self._call("stop_job", submission_id)

    def logs(self, submission_id: str) -> str:
        return self._call("get_job_logs", submission_id)

    def ping(self) -> str:
        self._call("list_jobs")
        return "ok"
