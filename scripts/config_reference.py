"""Generate docs/config-reference.md from the pydantic models (a test keeps the file in sync).

    python scripts/config_reference.py > docs/config-reference.md
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from orchestrator.config import ExperimentConfig
from sweeps.spec import SweepSpec

HEADER = """# Configuration reference

Generated from the pydantic models by `python scripts/config_reference.py`; do not edit by
hand (`tests/test_config_reference.py` fails when this file is stale).

Every field can be set in a preset/YAML file, with `--set section.field=value` on the command
line, in a REST request body (`overrides`), and appears flattened as an MLflow param.
"""


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "(section)" if isinstance(value, BaseModel) else repr(value)
    if field.default is PydanticUndefined:
        return "**required**"
    return repr(field.default)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    candidates = [annotation, *typing.get_args(annotation)]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _section(model: type[BaseModel], prefix: str, out: list[str]) -> None:
    rows, nested = [], []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        child = _nested_model(field.annotation)
        if child is not None and typing.get_origin(field.annotation) is not dict:
            nested.append((path, child))
            continue
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
    if rows:
        doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out += [f"### `{prefix.rstrip('.') or model.__name__}` ({model.__name__})", "", doc, "",
                "| field | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for path, child in nested:
        _section(child, f"{path}.", out)


def render() -> str:
    out = [HEADER, "## Experiment (`python -m orchestrator.train`, `POST /v1/runs`)", ""]
    _section(ExperimentConfig, "", out)
    out += ["## Sweep spec (`python -m sweeps.run`, `POST /v1/sweeps`)", ""]
    _section(SweepSpec, "", out)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
