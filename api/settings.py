"""Settings of the control plane, from ``GMTS_*`` environment variables (pydantic-settings).

Everything that decides where the service writes, what it may read and whom it talks to lives here,
never in a request: the state directory, the roots that model/data paths must stay under, the Ray
Jobs API address and token, the MLflow tracking URI and the size limit of request bodies.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# Repository root: the Ray job imports sweeps/ and orchestrator/ from here unless told otherwise.
CODE_DIR = Path(__file__).resolve().parents[1]
DEFAULT_STATE_DIR = Path("~/.local/share/gmts-lab/api")
DEFAULT_MODEL_CACHE = Path("~/.cache/gmts-lab")
MIN_TOKEN_CHARS = 16


class SettingsError(ValueError):
    """The service is misconfigured (no token, unreadable token file …); it refuses to start."""


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GMTS_", extra="ignore")

    host: str = Field("127.0.0.1", description="Bind address; loopback unless told otherwise.")
    port: int = Field(8000, ge=1, le=65535)
    api_token: SecretStr | None = Field(None, description="Bearer token clients must send (GMTS_API_TOKEN).")
    api_token_file: Path | None = Field(None, description="File holding the bearer token (GMTS_API_TOKEN_FILE).")
    state_dir: Path = Field(DEFAULT_STATE_DIR, description="SQLite records, submitted specs, default run outputs.")
    allowed_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Model/data/output paths must resolve under one of these (JSON list or ':'-separated). "
        "Empty = ~/.cache/gmts-lab (the model cache); the state dir is always allowed (run outputs go there).",
    )
    ray_address: str = Field("http://127.0.0.1:8265", description="Ray Jobs API (the dashboard's HTTP port).")
    ray_auth_token: SecretStr | None = Field(None, description="Token of a RAY_AUTH_MODE=token cluster.")
    ray_auth_token_file: Path | None = None
    mlflow_tracking_uri: str | None = Field(None, description="None = sqlite:///<state_dir>/mlflow.db.")
    storage: str | None = Field(None, description="Sweeps' durable state (records, Tune state, checkpoints): a "
                                "folder every Ray node sees or an object store URI (s3://…); None = each sweep's "
                                "output folder. Passed to jobs as GMTS_STORAGE.")
    mlflow_ui_url: str | None = Field(None, description="Base URL of the MLflow UI for links; None = the tracking URI if http(s).")
    max_body_bytes: int = Field(256 * 1024, ge=1024)
    access_log: bool = Field(False, description="uvicorn's access log, a line per request: off by default, as "
                             "it costs CPU on every read (submissions and cancels are logged either way).")
    cancel_wait_s: float = Field(20.0, ge=0, le=3600, description="How long cancel waits for the job to be gone.")
    reconcile_interval_s: float = Field(5.0, gt=0, le=3600, description="Background reconciliation and reaping period.")
    kill_grace_s: float = Field(5.0, ge=0, le=600, description="SIGTERM → SIGKILL delay for what outlives its job.")
    settle_quiet_s: float = Field(30.0, ge=0, le=3600, description="A finished job is settled once checks over "
                                  "this long found nothing of it left (catches drivers that start late).")
    job_pythonpath: str | None = Field(
        str(CODE_DIR), description="PYTHONPATH of the Ray job (where sweeps/ and orchestrator/ are); '' = none."
    )

    @field_validator("allowed_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [part for part in text.split(os.pathsep) if part]
        return value

    @model_validator(mode="after")
    def _resolve_paths(self) -> ApiSettings:
        self.state_dir = self.state_dir.expanduser().resolve()
        roots = [*(self.allowed_roots or [DEFAULT_MODEL_CACHE]), self.state_dir]
        self.allowed_roots = list(dict.fromkeys(root.expanduser().resolve() for root in roots))
        for root in self.allowed_roots:
            if root == Path(root.anchor):
                raise ValueError(f"allowed_roots: {root} is a filesystem root; name a folder")
        return self

    def tracking_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{self.state_dir / 'mlflow.db'}"

    def ui_url(self) -> str | None:
        if self.mlflow_ui_url:
            return self.mlflow_ui_url.rstrip("/")
        uri = self.tracking_uri()
        return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None

    def bearer_token(self) -> bytes:
        """The API's own token; the service refuses to start without one (or with a short one)."""
        token = _secret(self.api_token, self.api_token_file, "GMTS_API_TOKEN")
        if token is None:
            raise SettingsError("no API token: set GMTS_API_TOKEN or GMTS_API_TOKEN_FILE (every /v1 call needs it)")
        if len(token) < MIN_TOKEN_CHARS:
            raise SettingsError(f"the API token has {len(token)} characters; use at least {MIN_TOKEN_CHARS}")
        return token.encode()

    def ray_token(self) -> str | None:
        """The Ray cluster's token, if configured here (else Ray's own RAY_AUTH_TOKEN* lookup applies)."""
        return _secret(self.ray_auth_token, self.ray_auth_token_file, "GMTS_RAY_AUTH_TOKEN")


def _secret(value: SecretStr | None, file: Path | None, name: str) -> str | None:
    if value is not None and value.get_secret_value().strip():
        return value.get_secret_value().strip()
    if file is None:
        return None
    try:
        text = file.expanduser().read_text().strip()
    except OSError as exc:
        raise SettingsError(f"{name}_FILE: cannot read {file}: {exc.strerror}") from None
    if not text:
        raise SettingsError(f"{name}_FILE: {file} is empty")
    return text
