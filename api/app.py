"""The FastAPI app: routes, bearer-token auth, the body-size limit and one error shape for every 4xx/5xx.

``create_app(settings, jobs)`` builds it; ``jobs`` defaults to the real Ray Jobs API client
(api/ray_jobs.py). Action handlers are plain functions (FastAPI runs them in its thread pool) because
the Ray and MLflow clients block. List and get are async and answer from ready JSON bytes
(api/reads.py), and the token check is async too: a cached read never leaves the event loop.
"""

import hmac
import logging
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from api.models import (
    ErrorBody,
    Health,
    JobLogs,
    Links,
    MlflowLink,
    Readiness,
    SubmissionList,
    SubmissionOut,
    SweepResults,
    TrialProgress,
)
from api.ray_jobs import JobsBackend, RayJobs, RayRefused
from api.reads import ReadCache
from api.service import Conflict, ControlPlane, IdempotencyKeyReused, NotFound, Unavailable, View
from api.settings import ApiSettings
from api.store import Kind
from api.submissions import RequestRejected
from api.tracking_view import TrackingView
from sweeps.spec import BaseExperiment, SweepSpec

logger = logging.getLogger(__name__)

SWEEP_ID = r"^sw-[0-9a-f]{16}$"
RUN_ID = r"^run-[0-9a-f]{16}$"
IDEMPOTENCY_KEY = r"^[\x21-\x7e]{1,200}$"  # printable ASCII, no spaces
IdemKey = Annotated[str | None, Header(alias="Idempotency-Key", pattern=IDEMPOTENCY_KEY,
                                       description="Same key + same body = the same submission, once.")]
SweepId = Annotated[str, Path(pattern=SWEEP_ID)]
RunId = Annotated[str, Path(pattern=RUN_ID)]
Tail = Annotated[int, Query(ge=1, le=10_000, description="How many of the last log lines.")]
Limit = Annotated[int, Query(ge=1, le=1000)]
StatusFilter = Annotated[str | None, Query(pattern=r"^(pending|running|succeeded|failed|cancelled)$")]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "Malformed request (e.g. not JSON).",
        401: "Missing or wrong bearer token.",
        404: "No such sweep or run.",
        409: "Not possible in the current state.",
        413: "Request body larger than GMTS_MAX_BODY_BYTES.",
        422: "Invalid request; `message` names the field.",
        503: "Ray or MLflow unreachable.",
    }.items()
}


def create_app(settings: ApiSettings | None = None, jobs: JobsBackend | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    token = settings.bearer_token()  # no token, no service
    jobs = jobs or RayJobs(settings.ray_address, settings.ray_token())
    plane = ControlPlane(settings, jobs, TrackingView(settings.tracking_uri(), settings.ui_url()))

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        # In the background from the first second: /healthz answers at once, and records a previous
        # process left unsettled (Ray, driver and MLflow disagreeing) are repaired.
        plane.start_background(settings.reconcile_interval_s)
        yield
        plane.close()

    # FastAPIOffline: FastAPI whose /docs and /redoc load Swagger UI and ReDoc from files of the
    # installed package (under /static-offline-docs), not from a CDN an offline cluster cannot reach.
    app = FastAPIOffline(
        title="gmts-lab control plane",
        version="1",
        description="Launch, watch, cancel and compare GMTS/ETS ablation sweeps (Ray Jobs + MLflow).",
        lifespan=lifespan,
    )
    app.state.plane = plane
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    _add_error_handlers(app)
    app.include_router(_v1_router(plane, token))

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Health:
        """The process is up (no dependency checked)."""
        return Health(status="ok")

    @app.get("/readyz", response_model=Readiness, tags=["health"], responses={503: {"model": Readiness}})
    def readyz(response: Response) -> Readiness:
        """Ray's Jobs API and MLflow both answer."""
        ray, mlflow = _probe(jobs.ping), _probe(plane.tracking.ping)
        ready = ray == "ok" and mlflow == "ok"
        response.status_code = 200 if ready else 503
        return Readiness(ready=ready, ray=ray, mlflow=mlflow)

    return app


def _probe(check) -> str:
    """"ok", or why not in words that name no address or secret (/readyz has no token)."""
    try:
        return check()
    except RayRefused as exc:  # Ray answers: a wrong token, not a network problem
        if exc.token_sent:
            return "refused: the Ray cluster rejected the token (check GMTS_RAY_AUTH_TOKEN / GMTS_RAY_AUTH_TOKEN_FILE)"
        return "refused: the Ray cluster wants a token and got none (set GMTS_RAY_AUTH_TOKEN or GMTS_RAY_AUTH_TOKEN_FILE)"
    except Exception as exc:  # noqa: BLE001 - whatever fails, the dependency is not ready
        return f"unreachable ({type(exc).__name__})"


# -- auth -----------------------------------------------------------------------------------------


def _token_dependency(token: bytes):
    bearer = HTTPBearer(auto_error=False, description="GMTS_API_TOKEN of the server")

    async def require_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        if credentials is None:
            raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <GMTS_API_TOKEN>'",
                                headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(credentials.credentials.encode(), token):
            raise HTTPException(401, "invalid bearer token", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})

    return require_token


# -- routes ---------------------------------------------------------------------------------------


def _v1_router(plane: ControlPlane, token: bytes) -> APIRouter:
    router = APIRouter(prefix="/v1", dependencies=[Depends(_token_dependency(token))], responses=ERRORS)
    shared = _Handlers(plane)
    _add_sweep_routes(router, shared)
    _add_run_routes(router, shared)
    return router


class _Handlers:
    """What the sweeps and the runs routes share: the two kinds are twins (submit, list, get, logs, cancel)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        # Reads serve SQLite only: the background reconciler brings statuses from Ray and progress from
        # MLflow into it (api/service.py), so that no list/get waits on either; and they serve it as JSON
        # bytes built once per change of the store (api/reads.py). The bodies are the response models'
        # own serialisation, so they are what the OpenAPI schema says.
        self.cache = ReadCache(lambda: plane.store.version)

    def submitted(self, kind: Kind, body, key: str | None, response: Response) -> SubmissionOut:
        record, replayed = self.plane.submit(kind, body, key)
        if replayed:
            response.headers["Idempotent-Replayed"] = "true"
        return _out(self.plane.view(record))

    async def listing(self, kind: Kind, limit: int, status: str | None) -> Response:
        def build() -> bytes:
            items = [_out(self.plane.view(record)) for record in self.plane.store.list(kind, limit, status)]
            return SubmissionList(items=items, warnings=[]).model_dump_json().encode()

        return _json(await self.cache.body(("list", kind, limit, status), build))

    async def one(self, kind: Kind, api_id: str) -> Response:
        def build() -> bytes:
            return _out(self.plane.view(self.plane.get(kind, api_id))).model_dump_json().encode()

        return _json(await self.cache.body(("get", kind, api_id), build))

    def cancelled(self, kind: Kind, api_id: str, response: Response) -> SubmissionOut:
        record, leftovers = self.plane.cancel(self.plane.get(kind, api_id))
        done = record.finished and leftovers is not None and leftovers.clear
        response.status_code = 200 if done else 202
        view = self.plane.view(record)
        if not done:
            view.warnings.append("stopping: " + (leftovers.describe() if leftovers else f"Ray still says {record.ray_status}"))
        return _out(view)

    def logs(self, kind: Kind, api_id: str, tail: int) -> JobLogs:
        record = self.plane.get(kind, api_id)
        lines, truncated = self.plane.logs(record, tail)
        return JobLogs(id=record.id, ray_submission_id=record.ray_submission_id, lines=lines, truncated=truncated)


def _add_sweep_routes(router: APIRouter, shared: _Handlers) -> None:
    """/v1/sweeps: submit, list, get, results, logs, cancel, resume."""

    @router.post("/sweeps", status_code=201, response_model=SubmissionOut, tags=["sweeps"])
    def submit_sweep(spec: SweepSpec, response: Response, idempotency_key: IdemKey = None) -> SubmissionOut:
        """Validate a sweep spec fully (every trial's config, paths under the allowed roots) and start it
        as a Ray job (`python -m sweeps.run <validated spec>`)."""
        return shared.submitted("sweep", spec, idempotency_key, response)

    @router.get("/sweeps", response_model=SubmissionList, tags=["sweeps"])
    async def list_sweeps(limit: Limit = 100, status: StatusFilter = None) -> Response:
        return await shared.listing("sweep", limit, status)

    @router.get("/sweeps/{sweep_id}", response_model=SubmissionOut, tags=["sweeps"])
    async def get_sweep(sweep_id: SweepId) -> Response:
        return await shared.one("sweep", sweep_id)

    @router.get("/sweeps/{sweep_id}/results", response_model=SweepResults, tags=["sweeps"])
    def sweep_results(sweep_id: SweepId) -> SweepResults:
        """The ablation table (sweeps.report.ablation_results on the parent run) as JSON."""
        record = shared.plane.get("sweep", sweep_id)
        parent, trials, table = shared.plane.results(record)
        note = shared.plane.results_note(record, trials)
        return SweepResults(sweep_id=record.id, status=record.status, parent_run_id=parent, complete=not note,
                            note=note, results=table)

    @router.get("/sweeps/{sweep_id}/logs", response_model=JobLogs, tags=["sweeps"])
    def sweep_logs(sweep_id: SweepId, tail: Tail = 200) -> JobLogs:
        return shared.logs("sweep", sweep_id, tail)

    @router.post("/sweeps/{sweep_id}/cancel", response_model=SubmissionOut, tags=["sweeps"],
                 responses={202: {"model": SubmissionOut, "description": "Stop requested; Ray has not stopped it yet."}})
    def cancel_sweep(sweep_id: SweepId, response: Response) -> SubmissionOut:
        """Stop the Ray job, then mark the MLflow parent and its unfinished trial runs KILLED. Repeating it
        is harmless: a finished sweep answers 200 with its state."""
        return shared.cancelled("sweep", sweep_id, response)

    @router.post("/sweeps/{sweep_id}/resume", response_model=SubmissionOut, tags=["sweeps"])
    def resume_sweep(sweep_id: SweepId) -> SubmissionOut:
        """Continue a failed or cancelled sweep (its job failed, was stopped, or its cluster was lost) as a new Ray
        job under the same id: finished trials stay finished, the others continue from their last checkpoints,
        in the same MLflow parent run (`python -m sweeps.run --resume`). 409 while the sweep runs, when it
        succeeded, or while something of its last job still runs."""
        return _out(shared.plane.view(shared.plane.resume(shared.plane.get("sweep", sweep_id))))


def _add_run_routes(router: APIRouter, shared: _Handlers) -> None:
    """/v1/runs: submit, list, get, logs, cancel."""

    @router.post("/runs", status_code=201, response_model=SubmissionOut, tags=["runs"])
    def submit_run(request: BaseExperiment, response: Response, idempotency_key: IdemKey = None) -> SubmissionOut:
        """One training run: a preset plus dotted overrides (`python -m orchestrator.train --config …`)."""
        return shared.submitted("run", request, idempotency_key, response)

    @router.get("/runs", response_model=SubmissionList, tags=["runs"])
    async def list_runs(limit: Limit = 100, status: StatusFilter = None) -> Response:
        return await shared.listing("run", limit, status)

    @router.get("/runs/{run_id}", response_model=SubmissionOut, tags=["runs"])
    async def get_run(run_id: RunId) -> Response:
        return await shared.one("run", run_id)

    @router.get("/runs/{run_id}/logs", response_model=JobLogs, tags=["runs"])
    def run_logs(run_id: RunId, tail: Tail = 200) -> JobLogs:
        return shared.logs("run", run_id, tail)

    @router.post("/runs/{run_id}/cancel", response_model=SubmissionOut, tags=["runs"],
                 responses={202: {"model": SubmissionOut, "description": "Stop requested; Ray has not stopped it yet."}})
    def cancel_run(run_id: RunId, response: Response) -> SubmissionOut:
        return shared.cancelled("run", run_id, response)


def _json(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def _out(view: View) -> SubmissionOut:
    record = view.record
    base = f"/v1/{record.kind}s/{record.id}"
    return SubmissionOut(
        id=record.id,
        kind=record.kind,
        name=record.name,
        status=record.status,
        ray_submission_id=record.ray_submission_id,
        ray_status=record.ray_status,
        message=record.message,
        cancel_requested=record.cancel_requested,
        created_at=datetime.fromtimestamp(record.created_at, UTC),
        updated_at=datetime.fromtimestamp(record.updated_at, UTC),
        trials=TrialProgress(**vars(view.trials)),
        mlflow=MlflowLink(experiment=record.experiment, run_id=record.mlflow_run_id, ui_url=view.ui_url),
        links=Links(self=base, logs=f"{base}/logs", cancel=f"{base}/cancel",
                    results=f"{base}/results" if record.kind == "sweep" else None,
                    resume=f"{base}/resume" if record.kind == "sweep" else None),
        settled=record.settled_at is not None,
        warnings=view.warnings,
    )


# -- errors ---------------------------------------------------------------------------------------


def _error(status: int, message: str, detail: list[dict[str, Any]] | str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"message": message, "detail": message if detail is None else detail}
    return JSONResponse(body, status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(error.get("type") == "json_invalid" for error in errors):
            error = next(e for e in errors if e.get("type") == "json_invalid")
            position = error["loc"][-1] if error.get("loc") else "?"
            reason = (error.get("ctx") or {}).get("error", error.get("msg"))
            return _error(400, f"malformed JSON body: {reason} at position {position}")
        items = [
            {"loc": [part if isinstance(part, int) else str(part) for part in error.get("loc", ())],
             "msg": str(error.get("msg")), "type": str(error.get("type"))}
            for error in errors
        ]
        message = "; ".join(f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}" for item in items[:5])
        return _error(422, message, items)

    @app.exception_handler(RequestRejected)
    async def rejected(_: Request, exc: RequestRejected) -> JSONResponse:
        items = [{"loc": ["body", field], "msg": message, "type": "value_error"} for field, message in exc.errors]
        return _error(422, "; ".join(f"{field}: {message}" for field, message in exc.errors[:5]), items)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            # Starlette names only the first route of the path in Allow (POST for /v1/sweeps, which also
            # has GET); RFC 9110 wants every method the path supports. OPTIONS is not one: no CORS here.
            allowed = sorted({method for route in request.app.routes
                              if isinstance(route, APIRoute) and route.path_regex.match(request.url.path)
                              for method in route.methods})
            message = f"{request.method} is not allowed on {request.url.path}; allowed: {', '.join(allowed)}"
            return _error(405, message, headers={**(headers or {}), "Allow": ", ".join(allowed)})
        return _error(exc.status_code, str(exc.detail), headers=headers)

    for exc_type, status in ((NotFound, 404), (Conflict, 409), (IdempotencyKeyReused, 422), (Unavailable, 503)):
        app.add_exception_handler(exc_type, _status_handler(status))


def _status_handler(status: int):
    async def handler(_: Request, exc: Exception) -> JSONResponse:
        return _error(status, str(exc))

    return handler


# -- body size ------------------------------------------------------------------------------------


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes (GMTS_MAX_BODY_BYTES)")


class BodySizeLimit:
    """413 before reading a body whose Content-Length is too large; while reading, for chunked ones."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _error(400, "Content-Length is not a number")(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                await _error(413, f"request body is {int(declared)} bytes; the limit is {self.max_bytes} "
                                  "bytes (GMTS_MAX_BODY_BYTES)")(scope, receive, send)
                return
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)
