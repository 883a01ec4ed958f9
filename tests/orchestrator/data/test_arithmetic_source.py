"""The procedural arithmetic source: right answers, tiny-model charset, reproducible, disjoint splits."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from orchestrator.data import ArithmeticOptions, DatasetSpec, load_dataset
from orchestrator.data.arithmetic import arithmetic_problems, split_of

TINY_MODEL_CHARACTERS = re.compile(r"^[0-9+\-*= ]+$")
ALL_OPERATIONS = ArithmeticOptions(digits=2, operations=("+", "-", "*"))


@pytest.mark.slow
def test_problems_are_correct_and_use_only_the_tiny_models_characters() -> None:
    problems = arithmetic_problems(ALL_OPERATIONS, "train", limit=None, seed=0)
    for problem in problems:
        match = re.fullmatch(r"(\d+)([+\-*])(\d+)=", problem.prompt)
        assert match, problem.prompt
        a, operation, b = int(match[1]), match[2], int(match[3])
        assert int(problem.answer) == {"+": a + b, "-": a - b, "*": a * b}[operation]
        assert TINY_MODEL_CHARACTERS.match(problem.prompt) and TINY_MODEL_CHARACTERS.match(problem.answer)
        assert problem.domain == "arithmetic"
        assert problem.metadata == {"operation": operation, "operands": [a, b]}
    assert {p.metadata["operation"] for p in problems} == {"+", "-", "*"}


@pytest.mark.slow
def test_train_validation_and_test_are_the_whole_space_and_never_overlap() -> None:
    train = {p.prompt for p in arithmetic_problems(ALL_OPERATIONS, "train", None, seed=0)}
    validation = {p.prompt for p in arithmetic_problems(ALL_OPERATIONS, "validation", None, seed=2)}
    test = {p.prompt for p in arithmetic_problems(ALL_OPERATIONS, "test", None, seed=1)}
    assert not train & test and not train & validation and not validation & test
    assert len(train) + len(validation) + len(test) == 3 * 100 * 100
    # ~12 % each held out (the hash is uniform); wide bounds, the exact value is fixed by the hash anyway.
    assert 0.10 < len(test) / 30_000 < 0.14 and 0.10 < len(validation) / 30_000 < 0.14


def test_the_two_digit_addition_held_out_splits_are_big_enough_for_a_1_5_point_standard_error() -> None:
    options = ArithmeticOptions(digits=2, operations=("+",))
    test = arithmetic_problems(options, "test", None, seed=0)
    validation = arithmetic_problems(options, "validation", None, seed=0)
    train = arithmetic_problems(options, "train", None, seed=0)
    assert (len(test), len(validation), len(train)) == (1173, 1246, 7581)
    assert (0.25 / len(test)) ** 0.5 <= 0.015  # worst case p = 0.5
    assert not {p.prompt for p in test} & ({p.prompt for p in validation} | {p.prompt for p in train})


def test_commutative_pairs_share_a_split_but_subtraction_need_not() -> None:
    for a in range(100):
        for b in range(100):
            assert split_of("+", a, b, 0.1) == split_of("+", b, a, 0.1)
            assert split_of("*", a, b, 0.1) == split_of("*", b, a, 0.1)
    differing = sum(
        split_of("-", a, b, 0.5) != split_of("-", b, a, 0.5) for a in range(30) for b in range(30)
    )
    assert differing > 0


def test_same_seed_same_problems_other_seed_same_set_other_order() -> None:
    spec = DatasetSpec(source="arithmetic", arithmetic={"digits": 2}, seed=7)
    first, again = load_dataset(spec), load_dataset(spec)
    other = load_dataset(spec.model_copy(update={"seed": 8}))
    assert first == again
    assert {p.id for p in first} == {p.id for p in other}
    assert [p.id for p in first] != [p.id for p in other]


def test_limit_takes_a_seeded_sample_and_refuses_more_than_exists() -> None:
    spec = DatasetSpec(source="arithmetic", arithmetic={"digits": 2}, limit=50, seed=0)
    sample = load_dataset(spec)
    assert len(sample) == 50 and len({p.id for p in sample}) == 50
    assert sample == load_dataset(spec.model_copy(update={"limit": 100}))[:50]
    with pytest.raises(ValueError, match=r"limit: 500 asked, but the test split .* holds only \d+"):
        load_dataset(DatasetSpec(source="arithmetic", split="test", arithmetic={"digits": 1}, limit=500))


@pytest.mark.slow
def test_no_negative_results_when_disallowed() -> None:
    options = ArithmeticOptions(digits=2, operations=("-",), allow_negative_results=False)
    problems = arithmetic_problems(options, "train", None, seed=0)
    assert problems and all(not p.answer.startswith("-") for p in problems)
    with_negatives = arithmetic_problems(
        options.model_copy(update={"allow_negative_results": True}), "train", None, 0
    )
    assert any(p.answer.startswith("-") for p in with_negatives)


def test_three_digits_are_sampled_disjointly_and_need_a_limit() -> None:
    options = ArithmeticOptions(digits=3, operations=("+", "*"))
    train = arithmetic_problems(options, "train", limit=2000, seed=0)
    test = arithmetic_problems(options, "test", limit=2000, seed=0)
    assert len({p.id for p in train}) == 2000 and len({p.id for p in test}) == 2000
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    assert max(int(operand) for p in train for operand in p.metadata["operands"]) > 99
    assert train == arithmetic_problems(options, "train", limit=2000, seed=0)
    with pytest.raises(ValueError, match=r"limit: arithmetic with digits=3 .* give a limit"):
        arithmetic_problems(options, "train", limit=None, seed=0)


def test_digits_outside_one_to_three_are_rejected() -> None:
    with pytest.raises(ValidationError):
        ArithmeticOptions(digits=0)
