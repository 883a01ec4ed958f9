"""Problems from local JSONL and Parquet files, in our schema or in verl's.

Our schema, one object per line (JSONL) or per row (Parquet):
  ``prompt`` (str), ``answer`` (str; an integer is accepted and turned into a string),
  ``domain`` (math | code | choice | arithmetic | reasoning_gym),
  optional ``id`` (str, default ``<file stem>-<row>``), ``tests`` (str), ``metadata`` (object; in
  Parquet also a JSON-encoded string, which is how ``save_problems`` writes it because rows' metadata
  differ in shape). Any other field is an error, so a typo cannot silently drop data.

verl's schema (recognised by a ``reward_model`` field in the first row):
  ``data_source``, ``prompt`` (list of ``{role, content}`` chat messages), ``ability``,
  ``reward_model = {ground_truth, style}``, ``extra_info`` (object, optional ``index``).
  The problem's prompt is the last user message; the whole message list is kept in
  ``metadata["messages"]`` and the chat template uses it as it is (verl prompts carry their own
  instructions).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from workers.problem import Domain, Problem

VERL_ABILITIES: dict[str, Domain] = {
    "math": "math",
    "arithmetic": "arithmetic",
    "choice": "choice",
    "multiple_choice": "choice",
}


class DataFileError(ValueError):
    """A row of a data file that does not fit its schema; the message names file, row and field."""

    def __init__(self, where: str, field: str, problem: str) -> None:
        super().__init__(f"{where}: field {field!r}: {problem}")
        self.where = where
        self.field = field


def load_problem_file(path: Path) -> list[Problem]:
    """Every problem in a ``.jsonl`` or ``.parquet`` file, in file order."""
    rows = list(_rows(path))
    if not rows:
        raise DataFileError(str(path), "prompt", "the file holds no problems")
    parse = _verl_problem if "reward_model" in rows[0][1] else _native_problem
    return [
        parse(row, where=where, default_id=f"{path.stem}-{index}") for index, (where, row) in enumerate(rows)
    ]


def save_problems(problems: list[Problem], path: Path) -> None:
    """Write problems in our schema; ``load_problem_file`` reads back equal problems."""
    records = [problem.model_dump() for problem in problems]
    if path.suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for record in records:
            record["metadata"] = json.dumps(record["metadata"], ensure_ascii=False)
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        raise ValueError(f"path: {path} must end in .jsonl or .parquet")


def _rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location for error messages, row as a plain dict) for each row."""
    if path.suffix == ".jsonl":
        with path.open("r", encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{path}: line {line_number}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataFileError(where, "<line>", f"not valid JSON ({error})") from error
                if not isinstance(row, dict):
                    raise DataFileError(where, "<line>", f"expected a JSON object, got {type(row).__name__}")
                yield where, row
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        # to_pylist gives plain dicts and lists (pandas would give numpy arrays for list columns).
        for index, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}: row {index}", row
    else:
        raise ValueError(f"path: {path} must end in .jsonl or .parquet")


def _native_problem(row: dict[str, Any], *, where: str, default_id: str) -> Problem:
    fields = dict(row)
    fields.setdefault("id", default_id)
    if fields.get("id") is None:
        fields["id"] = default_id
    if isinstance(fields.get("answer"), int) and not isinstance(fields["answer"], bool):
        fields["answer"] = str(fields["answer"])
    if isinstance(fields.get("metadata"), str):
        try:
            fields["metadata"] = json.loads(fields["metadata"])
        except json.JSONDecodeError as error:
            raise DataFileError(where, "metadata", f"a string, but not valid JSON ({error})") from error
    if fields.get("metadata") is None:
        fields.pop("metadata", None)
    return _problem(fields, where)


def _verl_problem(row: dict[str, Any], *, where: str, default_id: str) -> Problem:
    messages = row.get("prompt")
    if not isinstance(messages, list) or not all(
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), str)
        for message in messages
    ):
        raise DataFileError(where, "prompt", "expected a list of {role, content} chat messages")
    user_messages = [message["content"] for message in messages if message["role"] == "user"]
    if not user_messages:
        raise DataFileError(where, "prompt", "no message has role 'user'")

    ability = str(row.get("ability", "")).lower()
    if ability not in VERL_ABILITIES:
        raise DataFileError(
            where, "ability", f"{row.get('ability')!r} is not one of {sorted(VERL_ABILITIES)}"
        )

    reward_model = row.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, str | int | float):
        raise DataFileError(
            where, "reward_model.ground_truth", f"expected a string or number, got {ground_truth!r}"
        )

    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, dict):
        raise DataFileError(where, "extra_info", f"expected an object, got {type(extra_info).__name__}")
    data_source = str(row.get("data_source") or "verl")
    index = extra_info.get("index")
    return _problem(
        {
            "id": f"{data_source}-{index}" if index is not None else default_id,
            "prompt": user_messages[-1],
            "answer": str(ground_truth),
            "domain": VERL_ABILITIES[ability],
            "metadata": {
                "data_source": data_source,
                "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
                "reward_style": reward_model.get("style"),
                "extra_info": extra_info,
            },
        },
        where,
    )


def _problem(fields: dict[str, Any], where: str) -> Problem:
    try:
        return Problem(**fields)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "<row>"
        detail = first["msg"]
        if first["type"] == "literal_error" and first["loc"] == ("domain",):
            detail = f"{fields.get('domain')!r} is not one of {list(get_args(Domain))}"
        elif first["type"] == "extra_forbidden":
            detail = "unknown field (allowed: id, prompt, answer, domain, tests, metadata)"
        raise DataFileError(where, field, detail) from error
