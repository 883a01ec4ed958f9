"""Turn a request body into the file a Ray job runs — validated, confined, with server-set fields.

A request never reaches a shell: the job's entrypoint is a constant command plus the path of a YAML
file that this module writes into the service's own state directory (see api/README.md, "Why a
file"). Before that file is written:

- presets are shipped preset names, or YAML files under the allowed roots (their ``extends`` chain
  too) — never an arbitrary file of the server;
- every path a user sets (``output_dir``, ``model.path``, ``model.cache_dir``, file data sources) is
  confined to the allowed roots *before* the config is validated, so that validation messages
  ("file … does not exist") cannot probe the rest of the disk; then every ``Path`` field and file
  source of every validated trial config is checked again (catching presets and fields added later);
- the MLflow tracking URI and the output folder are the server's, and every run is tagged with the
  submission id so that its MLflow run can be found exactly (api/tracking_view.py).
"""

from __future__ import annotations

import json
import logging
import math
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from api.limits import MAX_TRIALS, number_errors
from api.settings import ApiSettings
from api.tracking_view import API_ID_TAG
from orchestrator.config import ExperimentConfig
from orchestrator.config_loader import ConfigError, apply_overrides, preset_names, read_config_dict
from orchestrator.data.config import BUILTIN_SOURCES, DatasetSpec
from sweeps.spec import BaseExperiment, SweepSpec, expand

logger = logging.getLogger(__name__)

PRESET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# Config keys that hold paths, checked in the user's overrides before anything reads them.
OVERRIDE_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
USER_PATH_KEYS = ("output_dir", "model.path", "model.cache_dir", "data.train.source")


class RequestRejected(ValueError):
    """A request that is well-formed JSON but not acceptable: (dotted body path, message) pairs."""

    def __init__(self, field: str, message: str, others: list[tuple[str, str]] | None = None) -> None:
        super().__init__(f"{field}: {message}")
        self.errors = [(field, message), *(others or [])]


@dataclass(frozen=True)
class PreparedJob:
    name: str
    experiment: str
    trials_total: int
    job_yaml: str
    output_dir: Path | None = None  # the server's folder the job writes into; None: the user chose one

    def entrypoint(self, kind: str, job_file: Path, output_dir: Path) -> str:
        return entrypoint(kind, job_file, output_dir)


def entrypoint(kind: str, job_file: Path, output_dir: Path, resume: bool = False) -> str:
    """The Ray job's command. Constant commands; the only variable parts are paths this service generated. api.job
    validates the file again, then runs sweeps.run / orchestrator.train on it."""
    if kind == "sweep":
        command = f"python -m api.job sweep {shlex.quote(str(job_file))} --output-dir {shlex.quote(str(output_dir))}"
        return f"{command} --resume" if resume else command
    return f"python -m api.job run {shlex.quote(str(job_file))}"


def confine(value: str | Path, field: str, roots: list[Path]) -> Path:
    """The resolved path if it lies under one of ``roots``; no '..', no symlink leading out."""
    if "\x00" in str(value):
        raise RequestRejected(field, "a path must not contain NUL characters")
    try:
        path = Path(value).expanduser()
        resolved = path.resolve()  # follows every symlink on the way, existing or not
    except (OSError, RuntimeError, ValueError) as exc:
        raise RequestRejected(field, f"{str(value)[:200]!r} is not a usable path ({exc})") from None
    if not path.is_absolute():
        raise RequestRejected(field, f"{str(value)!r} must be an absolute path under {_roots(roots)}")
    if ".." in path.parts:
        raise RequestRejected(field, f"{str(value)!r} must not contain '..'")
    if not any(resolved.is_relative_to(root) for root in roots):
        raise RequestRejected(field, f"{str(value)!r} is outside the allowed roots {_roots(roots)}")
    return resolved


def _roots(roots: list[Path]) -> str:
    return "[" + ", ".join(str(root) for root in roots) + "]"


def check_preset(source: Any, field: str, roots: list[Path], _depth: int = 0) -> None:
    """A shipped preset name, or a YAML file under the roots whose ``extends`` chain stays there too."""
    if not isinstance(source, str) or not source:
        raise RequestRejected(field, f"a preset must be a name or a YAML path, got {source!r}")
    if PRESET_NAME.match(source) and not source.endswith((".yaml", ".yml")):
        if source not in preset_names():
            raise RequestRejected(field, f"unknown preset {source!r}; presets: {', '.join(preset_names()) or '(none)'}")
        return
    if _depth > 8:
        raise RequestRejected(field, "extends: chain deeper than 8 files")
    path = confine(source, field, roots)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        raise RequestRejected(field, f"{source!r} is not a YAML file (.yaml/.yml)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RequestRejected(field, f"{source!r} is not valid YAML: {exc}") from None
    if isinstance(data, dict) and "extends" in data:
        check_preset(data["extends"], f"{field} (extends in {path.name})", roots, _depth + 1)


def _nested_overrides(overrides: dict[str, Any], field: str) -> dict[str, Any]:
    for key in overrides:
        if not OVERRIDE_KEY.match(key) or "" in key.split("."):
            raise RequestRejected(f"{field}.{key}", "keys are dotted config paths (letters, digits, '_', '-', '.')")
    try:
        return apply_overrides({}, [f"{key}={json.dumps(value)}" for key, value in overrides.items()])
    except ConfigError as exc:
        raise RequestRejected(field, str(exc)) from None


def _check_user_paths(overrides: dict[str, Any], field: str, roots: list[Path]) -> dict[str, Any]:
    nested = _nested_overrides(overrides, field)
    for key in USER_PATH_KEYS:
        value = _dig(nested, key)
        if value is None or (key == "data.train.source" and value in BUILTIN_SOURCES):
            continue
        confine(str(value), f"{field}.{key}", roots)
    eval_sets = _dig(nested, "data.eval")
    for name, spec in (eval_sets.items() if isinstance(eval_sets, dict) else []):
        source = spec.get("source") if isinstance(spec, dict) else None
        if source is not None and source not in BUILTIN_SOURCES:
            confine(str(source), f"{field}.data.eval.{name}.source", roots)
    return nested


def _dig(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def check_config_paths(model: BaseModel, field: str, roots: list[Path]) -> None:
    """Every Path field and every file data source of a validated config lies under the roots."""
    if isinstance(model, DatasetSpec) and model.is_file:
        confine(model.source, f"{field}.source", roots)
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, item in items:
            where = f"{field}.{name}" if key is None else f"{field}.{name}.{key}"
            if isinstance(item, Path):
                confine(item, where, roots)
            elif isinstance(item, BaseModel):
                check_config_paths(item, where, roots)


def output_dir(settings: ApiSettings, api_id: str) -> Path:
    """Where a submission's runs write (checkpoints, model copies): the server's, per submission."""
    return settings.state_dir / "runs" / api_id


def _tagged_overrides(user: dict[str, Any], nested: dict[str, Any], api_id: str, field: str) -> dict[str, Any]:
    """The user's overrides plus the submission-id tag on every run (merged into tracking.tags)."""
    user_tags = _dig(nested, "tracking.tags") or {}
    if not isinstance(user_tags, dict):
        raise RequestRejected(f"{field}.tracking.tags", f"must be a mapping of tag → value, got {user_tags!r}"[:300])
    tags = {**user_tags, API_ID_TAG: api_id}
    overrides = {"tracking.tags": tags}  # first, so that a user's tracking.tags.<key> still adds to it
    overrides.update({key: value for key, value in user.items() if key != "tracking.tags"})
    return overrides


def _check_tracking_uri(value: Any, field: str, settings: ApiSettings) -> None:
    if value is not None and value != settings.tracking_uri():
        raise RequestRejected(field, f"set by the server ({settings.tracking_uri()}); leave it out")


@contextmanager
def _config_errors(field: str) -> Iterator[None]:
    """ConfigError → 422. A TypeError or the like from a config validator fed odd JSON (a list where a
    name belongs) is a bad request too, not a server error; it is logged for whoever owns the validator."""
    try:
        yield
    except RequestRejected:
        raise
    except ConfigError as exc:
        raise RequestRejected(field, str(exc)) from None
    except (TypeError, AttributeError, KeyError, IndexError) as exc:
        logger.warning("config validation raised %s on a request; answering 422", type(exc).__name__, exc_info=True)
        raise RequestRejected(field, f"invalid value ({type(exc).__name__}: {exc})"[:400]) from None


def check_numbers(value: Any, field: str) -> None:
    """Every float finite, every integer inside its bound (api/limits.py); all offenders named."""
    errors = number_errors(value, field)
    if errors:
        raise RequestRejected(*errors[0], others=errors[1:])


def check_grid_size(spec: SweepSpec) -> None:
    """Before expanding: a grid of 1000 values on five axes would be 10^15 trial configs."""
    axes = [values for values in spec.grid.model_dump().values() if values is not None]
    size = math.prod(len(values) for values in axes) + len(spec.trials)
    if size > MAX_TRIALS:
        raise RequestRejected("grid", f"expands to up to {size} trials; a sweep may have at most {MAX_TRIALS}")


def prepare_sweep(spec: SweepSpec, settings: ApiSettings, api_id: str) -> PreparedJob:
    roots = settings.allowed_roots
    check_numbers(spec, "")
    check_grid_size(spec)
    check_preset(spec.base.preset, "base.preset", roots)
    for index, size in enumerate(spec.grid.model_size or []):
        check_preset(size, f"grid.model_size.{index}", roots)
    for index, point in enumerate(spec.trials):
        if "model_size" in point:
            check_preset(point["model_size"], f"trials.{index}.model_size", roots)
    _check_tracking_uri(spec.tracking_uri, "tracking_uri", settings)
    nested = _check_user_paths(spec.base.overrides, "base.overrides", roots)
    if _dig(nested, "output_dir") is not None:  # sweeps.run puts every trial under its --output-dir
        raise RequestRejected("base.overrides.output_dir", f"set by the server for sweeps "
                              f"({output_dir(settings, api_id)}); leave it out")
    _check_tracking_uri(_dig(nested, "tracking.tracking_uri"), "base.overrides.tracking.tracking_uri", settings)
    base = BaseExperiment(preset=spec.base.preset, overrides=_tagged_overrides(spec.base.overrides, nested, api_id, "base.overrides"))
    job_spec = spec.model_copy(update={"base": base, "tracking_uri": settings.tracking_uri()})
    with _config_errors("body"):
        trials = expand(job_spec, output_dir=output_dir(settings, api_id))
    for index, trial in enumerate(trials):
        check_config_paths(trial.config, f"trial {index} ({trial.name})", roots)
        check_numbers(trial.config, f"trial {index} ({trial.name})")
    return PreparedJob(
        name=spec.name,
        experiment=spec.experiment,
        trials_total=len(trials),
        job_yaml=yaml.safe_dump(job_spec.model_dump(mode="json"), sort_keys=False),
        output_dir=output_dir(settings, api_id),
    )


def prepare_run(request: BaseExperiment, settings: ApiSettings, api_id: str) -> PreparedJob:
    roots = settings.allowed_roots
    check_numbers(request, "")
    check_preset(request.preset, "preset", roots)
    nested = _check_user_paths(request.overrides, "overrides", roots)
    _check_tracking_uri(_dig(nested, "tracking.tracking_uri"), "overrides.tracking.tracking_uri", settings)
    overrides = _tagged_overrides(request.overrides, nested, api_id, "overrides")
    overrides["tracking.tracking_uri"] = settings.tracking_uri()
    server_dir = output_dir(settings, api_id) if _dig(nested, "output_dir") is None else None
    if server_dir is not None:
        overrides["output_dir"] = str(server_dir)
    with _config_errors("overrides"):
        data = apply_overrides(read_config_dict(request.preset), [f"{k}={json.dumps(v)}" for k, v in overrides.items()])
        try:
            config = ExperimentConfig.model_validate(data)
        except ValidationError as exc:
            errors = [
                (f"overrides.{'.'.join(str(part) for part in error['loc']) or '(root)'}",
                 f"{error['msg']} (got {error.get('input')!r})"[:400])
                for error in exc.errors()
            ]
            raise RequestRejected(*errors[0], others=errors[1:]) from None
    check_config_paths(config, "config", roots)
    check_numbers(config, "config")
    return PreparedJob(
        name=config.name,
        experiment=config.tracking.experiment,
        trials_total=1,
        job_yaml=yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False),
        output_dir=server_dir,
    )
