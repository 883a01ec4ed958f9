"""A small typed client of the REST API (httpx), used by the ``gmts`` CLI.

    client = GmtsClient.from_env()          # GMTS_API_URL, GMTS_API_TOKEN[_FILE], else the stack of `gmts up`
    sweep = client.submit_sweep(yaml.safe_load(open("spec.yaml")), idempotency_key="demo-1")
    sweep = client.wait(sweep.id)
    table = client.sweep_results(sweep.id).results
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

import httpx
from pydantic import BaseModel

from api.models import JobLogs, Readiness, SubmissionList, SubmissionOut, SweepResults

Model = TypeVar("Model", bound=BaseModel)
Kind = Literal["sweep", "run"]
TERMINAL = ("succeeded", "failed", "cancelled")


class ApiError(Exception):
    """A non-2xx answer; ``message`` is the server's one-line explanation. ``status`` is None when no
    answer came at all (no token configured, service unreachable): then the message says what to do."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message if status is None else f"HTTP {status}: {message}")
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: no answer at all, or a proxy/server saying it is (re)starting."""
        return isinstance(self, ApiUnreachable) or self.status in (502, 503, 504)


class ApiUnreachable(ApiError):
    """No answer from the URL (connection refused, timeout): the service is down or restarting."""

    def __init__(self, message: str) -> None:
        super().__init__(None, message)


class GmtsClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        self._http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout,
                                  transport=transport)

    @classmethod
    def from_env(cls, base_url: str | None = None, **kwargs: Any) -> GmtsClient:
        """GMTS_API_URL and GMTS_API_TOKEN (or GMTS_API_TOKEN_FILE) first; else the URL and token file that
        ``gmts up`` recorded in ``$GMTS_HOME/stack.json``; else http://$GMTS_HOST:$GMTS_PORT."""
        from api.local_stack import read_stack, stack_home

        stack_api = ((read_stack() or {}).get("api") or {})
        url = base_url or os.environ.get("GMTS_API_URL") or stack_api.get("url") or (
            f"http://{os.environ.get('GMTS_HOST', '127.0.0.1')}:{os.environ.get('GMTS_PORT', '8000')}")
        token = os.environ.get("GMTS_API_TOKEN", "").strip()
        token_file = os.environ.get("GMTS_API_TOKEN_FILE") or (None if token else stack_api.get("token_file"))
        if not token and token_file:
            token = Path(token_file).expanduser().read_text().strip()
        if not token:
            raise ApiError(None, "no API token: set GMTS_API_TOKEN (or GMTS_API_TOKEN_FILE) to the token "
                                 f"the service was started with, or start one with `gmts up` (it records its "
                                 f"token in {stack_home() / 'stack.json'})")
        return cls(url, token, **kwargs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, model: type[Model], method: str, path: str, **kwargs: Any) -> Model:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiUnreachable(f"cannot reach the gmts API at {self._http.base_url} ({type(exc).__name__}: {exc}); "
                                 "is `gmts serve` running there? (the URL comes from --url, GMTS_API_URL or "
                                 "`gmts up`'s stack.json; `gmts status` shows the local stack)") from None
        if response.is_error and not (path == "/readyz" and response.status_code == 503):
            try:
                message = response.json()["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise ApiError(response.status_code, message)
        return model.model_validate(response.json())

    # sweeps
    def submit_sweep(self, spec: dict[str, Any] | BaseModel, idempotency_key: str | None = None) -> SubmissionOut:
        body = spec.model_dump(mode="json", exclude_unset=True) if isinstance(spec, BaseModel) else spec
        return self._call(SubmissionOut, "POST", "/v1/sweeps", json=body, headers=_key(idempotency_key))

    def list_sweeps(self, status: str | None = None, limit: int = 100) -> SubmissionList:
        return self._call(SubmissionList, "GET", "/v1/sweeps", params=_params(status=status, limit=limit))

    def sweep(self, sweep_id: str) -> SubmissionOut:
        return self._call(SubmissionOut, "GET", f"/v1/sweeps/{sweep_id}")

    def sweep_results(self, sweep_id: str) -> SweepResults:
        return self._call(SweepResults, "GET", f"/v1/sweeps/{sweep_id}/results")

    def sweep_logs(self, sweep_id: str, tail: int = 200) -> JobLogs:
        return self._call(JobLogs, "GET", f"/v1/sweeps/{sweep_id}/logs", params={"tail": tail})

    def cancel_sweep(self, sweep_id: str) -> SubmissionOut:
        return self._call(SubmissionOut, "POST", f"/v1/sweeps/{sweep_id}/cancel")

    def resume_sweep(self, sweep_id: str) -> SubmissionOut:
        """Continue a failed or cancelled sweep from its checkpoints, under the same id."""
        return self._call(SubmissionOut, "POST", f"/v1/sweeps/{sweep_id}/resume")

    # single runs
    def submit_run(self, preset: str, overrides: dict[str, Any] | None = None,
                   idempotency_key: str | None = None) -> SubmissionOut:
        body = {"preset": preset, "overrides": overrides or {}}
        return self._call(SubmissionOut, "POST", "/v1/runs", json=body, headers=_key(idempotency_key))

    def list_runs(self, status: str | None = None, limit: int = 100) -> SubmissionList:
        return self._call(SubmissionList, "GET", "/v1/runs", params=_params(status=status, limit=limit))

    def run(self, run_id: str) -> SubmissionOut:
        return self._call(SubmissionOut, "GET", f"/v1/runs/{run_id}")

    def run_logs(self, run_id: str, tail: int = 200) -> JobLogs:
        return self._call(JobLogs, "GET", f"/v1/runs/{run_id}/logs", params={"tail": tail})

    def cancel_run(self, run_id: str) -> SubmissionOut:
        return self._call(SubmissionOut, "POST", f"/v1/runs/{run_id}/cancel")

    # both
    def wait(self, api_id: str, timeout: float = 3600.0, interval: float = 5.0) -> SubmissionOut:
        """Poll a sweep (``sw-…``) or run (``run-…``) until it has finished; TimeoutError otherwise."""
        get = self.run if api_id.startswith("run-") else self.sweep
        deadline = time.monotonic() + timeout
        while True:
            status = get(api_id)
            if status.status in TERMINAL:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"{api_id} still {status.status} after {timeout:.0f} s")
            time.sleep(interval)

    def ready(self) -> Readiness:
        return self._call(Readiness, "GET", "/readyz")


def _key(idempotency_key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": idempotency_key} if idempotency_key else {}


def _params(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}
