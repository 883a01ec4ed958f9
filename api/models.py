"""Response bodies of the REST API (request bodies are the models of sweeps/ and orchestrator/)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["pending", "running", "succeeded", "failed", "cancelled"]


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TrialProgress(_Response):
    total: int = Field(description="Trials in the expanded grid.")
    running: int = 0
    finished: int = 0
    failed: int = 0
    killed: int = 0


class MlflowLink(_Response):
    experiment: str
    run_id: str | None = Field(None, description="The sweep's parent run (or the single run); None until it exists.")
    ui_url: str | None = Field(None, description="Link into the MLflow UI, when its base URL is known.")


class Links(_Response):
    self: str
    logs: str
    cancel: str
    results: str | None = None
    resume: str | None = None


class SubmissionOut(_Response):
    id: str
    kind: Literal["sweep", "run"]
    name: str
    status: Status
    ray_submission_id: str
    ray_status: str | None = Field(None, description="Ray's own JobStatus, as last seen.")
    message: str = ""
    cancel_requested: bool = False
    created_at: datetime
    updated_at: datetime
    trials: TrialProgress
    mlflow: MlflowLink
    links: Links
    settled: bool = Field(False, description="Finished, and checks over 30 s found no driver, actor or open "
                          "MLflow run of it left (a cancel is then complete everywhere).")
    warnings: list[str] = Field(default_factory=list, description=(
        "E.g. MLflow unreachable: progress unknown; a process of the job that outlived its end and had to be "
        "killed (\"cancel: the job's driver (pid 1234) outlived Ray's stop; sent SIGTERM\"); after a cancel "
        "answered 202, what is still stopping."))


class SubmissionList(_Response):
    items: list[SubmissionOut]
    warnings: list[str] = Field(default_factory=list)


class SweepResults(_Response):
    sweep_id: str
    status: Status
    parent_run_id: str
    complete: bool = Field(description="The sweep succeeded and every trial finished: the table is final.")
    note: str = Field("", description="Why the table is not final (CANCELLED / FAILED / PARTIAL / INCOMPLETE …).")
    results: dict[str, Any] = Field(description="sweeps.report.ablation_results: the ablation table as JSON.")


class JobLogs(_Response):
    id: str
    ray_submission_id: str
    lines: list[str] = Field(description="The last lines of the Ray job's driver log.")
    truncated: bool


class Health(_Response):
    status: Literal["ok"]


class Readiness(_Response):
    ready: bool
    ray: str
    mlflow: str


class ErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """Every 4xx/5xx this service answers itself: ``message`` names the problem in one line."""

    message: str
    detail: list[ErrorItem] | str
