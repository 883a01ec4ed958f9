"""JSONL / Parquet / verl-Parquet files: round trips, auto-detection, and errors naming row and field."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.data import DataFileError, DatasetSpec, load_dataset, save_problems
from workers.problem import Problem


@pytest.fixture(scope="module")
def mixed_problems() -> list[Problem]:
    """One of each shape: arithmetic, code with tests, reasoning-gym with nested metadata, choice."""
    return [
        *load_dataset(DatasetSpec(source="arithmetic", arithmetic={"digits": 1}, limit=3)),
        *load_dataset(DatasetSpec(source="humaneval", limit=2)),
        *load_dataset(
            DatasetSpec(source="reasoning_gym", limit=3, reasoning_gym={"dataset": "leg_counting"})
        ),
        *load_dataset(DatasetSpec(source="gpqa_diamond", limit=2)),
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_keeps_every_field(tmp_path: Path, mixed_problems: list[Problem], suffix: str) -> None:
    path = tmp_path / f"mixed{suffix}"
    save_problems(mixed_problems, path)
    assert load_dataset(DatasetSpec(source=str(path))) == mixed_problems
    assert load_dataset(DatasetSpec(source=str(path), limit=4)) == mixed_problems[:4]


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def test_minimal_jsonl_rows_get_ids_and_string_answers(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"prompt": "2+2=", "answer": 4, "domain": "arithmetic"},
            {"prompt": "Why?", "answer": "x", "domain": "math"},
        ],
    )
    problems = load_dataset(DatasetSpec(source=str(path)))
    assert [p.id for p in problems] == ["mine-0", "mine-1"]
    assert problems[0].answer == "4" and problems[0].metadata == {} and problems[0].tests is None


def test_parquet_written_by_pandas_in_our_schema(tmp_path: Path) -> None:
    path = tmp_path / "plain.parquet"
    pd.DataFrame(
        {
            "id": ["a", "b"],
            "prompt": ["1+1=", "Integrate x."],
            "answer": ["2", "x^2/2"],
            "domain": ["arithmetic", "math"],
            "metadata": [{"level": 1}, {"level": 5}],
        }
    ).to_parquet(path)
    problems = load_dataset(DatasetSpec(source=str(path)))
    assert [(p.id, p.answer, p.metadata) for p in problems] == [
        ("a", "2", {"level": 1}),
        ("b", "x^2/2", {"level": 5}),
    ]


def _verl_rows() -> list[dict]:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {"role": "system", "content": "You are a careful solver."},
                {
                    "role": "user",
                    "content": f"What is {i}+{i}? Let's think step by step and output the final answer "
                    'after "####".',
                },
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(3)
    ]


def test_verl_parquet_is_detected_and_converted(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pd.DataFrame(_verl_rows()).to_parquet(path)
    problems = load_dataset(DatasetSpec(source=str(path)))
    assert [p.id for p in problems] == ["openai/gsm8k-0", "openai/gsm8k-1", "openai/gsm8k-2"]
    second = problems[1]
    assert second.prompt.startswith("What is 1+1?") and second.answer == "2" and second.domain == "math"
    assert second.metadata["messages"] == _verl_rows()[1]["prompt"]
    assert second.metadata["reward_style"] == "rule" and second.metadata["extra_info"]["split"] == "train"


@pytest.mark.parametrize(
    ("row", "field", "detail"),
    [
        ({"prompt": "1+1=", "domain": "math"}, "answer", "Field required"),
        ({"prompt": "1+1=", "answer": "2", "domain": "algebra"}, "domain", "'algebra' is not one of"),
        ({"prompt": "1+1=", "answer": "2", "domain": "math", "solution": "…"}, "solution", "unknown field"),
        ({"prompt": "", "answer": "2", "domain": "math"}, "prompt", "at least 1 character"),
        ({"prompt": "1+1=", "answer": 2.5, "domain": "math"}, "answer", "valid string"),
        (
            {"prompt": "1+1=", "answer": "2", "domain": "math", "metadata": "{oops"},
            "metadata",
            "not valid JSON",
        ),
    ],
)
def test_bad_jsonl_row_names_line_and_field(tmp_path: Path, row: dict, field: str, detail: str) -> None:
    good = {"prompt": "3+4=", "answer": "7", "domain": "arithmetic"}
    path = _write_jsonl(tmp_path / "bad.jsonl", [good, good | {"id": "second"}, row])
    with pytest.raises(DataFileError, match=rf"bad\.jsonl: line 3: field '{field}': .*{detail}") as excinfo:
        load_dataset(DatasetSpec(source=str(path)))
    assert excinfo.value.field == field


def test_bad_verl_rows_name_row_and_field(tmp_path: Path) -> None:
    cases = [
        ("ability", {"ability": "poetry"}, "'poetry' is not one of"),
        (
            "reward_model.ground_truth",
            {"reward_model": {"style": "rule", "ground_truth": None}},
            "string or number",
        ),
        (
            "prompt",
            {"prompt": [{"role": "system", "content": "only a system message"}]},
            "no message has role 'user'",
        ),
    ]
    for field, change, detail in cases:
        rows = _verl_rows()
        rows[2] = rows[2] | change
        path = tmp_path / f"verl-{field}.parquet"
        pd.DataFrame(rows).to_parquet(path)
        with pytest.raises(DataFileError, match=rf"row 2: field '{field}': .*{detail}"):
            load_dataset(DatasetSpec(source=str(path)))


def test_unreadable_lines_and_empty_files_are_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "1+1=", "answer": "2", "domain": "math"}\n{not json\n')
    with pytest.raises(DataFileError, match=r"line 2: .*not valid JSON"):
        load_dataset(DatasetSpec(source=str(broken)))
    array = _write_jsonl(tmp_path / "array.jsonl", [["prompt", "answer"]])
    with pytest.raises(DataFileError, match=r"line 1: .*expected a JSON object, got list"):
        load_dataset(DatasetSpec(source=str(array)))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataFileError, match="holds no problems"):
        load_dataset(DatasetSpec(source=str(empty)))


def test_duplicate_ids_in_a_file_are_refused(tmp_path: Path) -> None:
    row = {"id": "same", "prompt": "1+1=", "answer": "2", "domain": "arithmetic"}
    path = _write_jsonl(tmp_path / "dupes.jsonl", [row, row])
    with pytest.raises(ValueError, match=r"duplicate problem ids, e\.g\. \['same'\]"):
        load_dataset(DatasetSpec(source=str(path)))
