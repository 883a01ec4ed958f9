"""Load an ExperimentConfig from a preset name or YAML file plus ``--set a.b=c`` overrides.

A YAML file may start with ``extends: <preset or path>`` to inherit another one; keys it sets
replace (dicts merge) those of the parent. ``${VAR}`` in its strings expands from the environment
(the GPU presets find models under ``${GMTS_MODELS_DIR}``). Override values are parsed as YAML scalars, so
``--set selection.ratio=0.2`` is a float and ``--set model.path=null`` is None.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator.config import ExperimentConfig, _deep_merge

PRESET_PACKAGE = "orchestrator.presets"


class ConfigError(ValueError):
    """A configuration problem, with the offending field path in the message."""


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(PRESET_PACKAGE).iterdir() if p.name.endswith(".yaml"))


def read_config_dict(source: str | Path, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The merged YAML mapping of a preset name or a file path (``extends`` resolved)."""
    text, where = _read_source(str(source))
    if where in _seen:
        raise ConfigError(f"extends: cycle through {' -> '.join(_seen + (where,))}")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level must be a mapping, got {type(data).__name__}")
    data = _expand_env(data)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    return _deep_merge(read_config_dict(parent, _seen + (where,)), data)


def _expand_env(value: Any) -> Any:
    """``${VAR}`` in string values becomes the variable's value (model and data roots of presets)."""
    if isinstance(value, dict):
        return {key: _expand_env(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand_env(item) for item in value]
    return os.path.expandvars(value) if isinstance(value, str) else value


def _read_source(source: str) -> tuple[str, str]:
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config: no such file {source!r}")
        return path.read_text(), str(path.resolve())
    preset = resources.files(PRESET_PACKAGE) / f"{source}.yaml"
    if not preset.is_file():
        raise ConfigError(f"config: {source!r} is neither a file nor a preset; presets: {', '.join(preset_names())}")
    return preset.read_text(), f"preset:{source}"


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    data = _deep_merge({}, data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return data


def validate(model: type[BaseModel], data: dict[str, Any], origin: str = "config") -> Any:
    """Validate ``data`` into ``model``; on failure raise ConfigError listing every field path."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, origin)) from None


def format_validation_error(exc: ValidationError, origin: str = "config") -> str:
    lines = [f"{origin}: {exc.error_count()} invalid field(s)"]
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"]) or "(root)"
        lines.append(f"  {path}: {error['msg']} (got {error.get('input')!r})"[:400])
    return "\n".join(lines)


def load_experiment(source: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    data = apply_overrides(read_config_dict(source), overrides or [])
    return validate(ExperimentConfig, data, origin=str(source))
