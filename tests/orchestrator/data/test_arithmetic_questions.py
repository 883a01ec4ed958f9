"""The question style of the arithmetic source ("What is 23 + 45?"), the real-model task, and what it pays.

The reward runs the real math verifier, as a reward worker does. A policy that restates the question in any
words must earn nothing, so the source leaves out every problem whose answer is one of its operands; these
tests check that over whole splits, not on a hand-picked example.
"""

from __future__ import annotations

import re

import pytest

from orchestrator.data import ArithmeticOptions, DatasetSpec, load_dataset
from orchestrator.data.arithmetic import arithmetic_problems
from workers.reward.math_verifier import verify_math

QUESTIONS = ArithmeticOptions(digits=1, operations=("+", "-", "*"), style="question")
EQUATIONS = ArithmeticOptions(digits=1, operations=("+", "-", "*"))


def _all(options: ArithmeticOptions):
    return [p for split in ("train", "validation", "test") for p in arithmetic_problems(options, split, None, seed=0)]


def test_questions_are_correct_math_problems_without_answers_among_their_operands() -> None:
    problems = _all(QUESTIONS)
    for problem in problems:
        match = re.fullmatch(r"What is (\d+) ([+\-*]) (\d+)\?", problem.prompt)
        assert match, problem.prompt
        a, operation, b = int(match[1]), match[2], int(match[3])
        assert int(problem.answer) == {"+": a + b, "-": a - b, "*": a * b}[operation]
        assert int(problem.answer) not in (a, b)
        assert problem.domain == "math"
    # Exactly the equation problems minus those whose answer is an operand (0 + 7, 7 - 0, 8 - 4, 1 * 7, 0 * 7 …).
    equations = _all(EQUATIONS)
    left_out = [p for p in equations if int(p.answer) in p.metadata["operands"]]
    assert len(problems) == len(equations) - len(left_out) and len(left_out) > 0
    assert {p.id for p in problems} == {p.id for p in equations} - {p.id for p in left_out}


@pytest.mark.slow
def test_a_problem_keeps_its_split_in_both_styles() -> None:
    options = {"digits": 2, "operations": ["+", "-"]}
    for split in ("train", "validation", "test"):
        questions = {p.id for p in load_dataset(DatasetSpec(source="arithmetic", split=split,
                                                            arithmetic={**options, "style": "question"}))}
        equations = {p.id for p in load_dataset(DatasetSpec(source="arithmetic", split=split, arithmetic=options))}
        assert questions < equations


def _restatements(problem) -> list[str]:
    a, b = problem.metadata["operands"]
    op = problem.metadata["operation"]
    word = {"+": "plus", "-": "minus", "*": "times"}[op]
    return [problem.prompt, f"{a} {op} {b}", f"{a}{op}{b}=", f"{a} {op} {b} = ?", f"{a} {word} {b}",
            f"{b} {op} {a}", f"The question asks for {a} {word} {b}.", f"{problem.prompt} {a} {op} {b}"]


# Reads every test problem of the split (the 2-digit case: minutes on 2 cores).
@pytest.mark.slow
@pytest.mark.parametrize("digits,operations", [(1, ("+", "-", "*")), (2, ("+",))])
def test_restating_the_question_never_pays(digits: int, operations: tuple[str, ...]) -> None:
    options = ArithmeticOptions(digits=digits, operations=operations, style="question")
    problems = arithmetic_problems(options, "test", None, seed=0)
    for problem in problems:
        for echo in _restatements(problem):
            assert verify_math(echo, problem) == 0.0, (problem.prompt, echo)


@pytest.mark.slow
def test_hedges_never_pay_and_committed_answers_do() -> None:
    for problem in arithmetic_problems(ArithmeticOptions(digits=2, style="question"), "test", 40, seed=0):
        a, b = problem.metadata["operands"]
        r = int(problem.answer)
        for hedge in (f"{a} + {b} = {r} or {r + 1}", f"{r - 1}, {r}", f"\\boxed{{{r}}} \\boxed{{{r + 1}}}",
                      f"The answer is {r} or {r + 1}.", f"\\boxed{{{r}, {r + 1}}}", f"\\boxed{{\\pm {r}}}",
                      f"{r}" * 30, "\\boxed{}"):
            assert verify_math(hedge, problem) == 0.0, (problem.prompt, hedge)
        for committed in (f"{a} + {b} = {r}", f"{r}", f"The answer is {r}.", f"\\boxed{{{r}}}",
                          f"{problem.prompt} {a} + {b} = {r}", f"{a} plus {b} equals {r}."):
            assert verify_math(committed, problem) == 1.0, (problem.prompt, committed)


def test_equation_style_is_unchanged_for_the_tiny_model() -> None:
    problems = arithmetic_problems(ArithmeticOptions(digits=1), "train", None, seed=0)
    assert all(re.fullmatch(r"\d+\+\d+=", p.prompt) and p.domain == "arithmetic" for p in problems)
    assert any(p.metadata["operands"][0] == 0 for p in problems)  # nothing left out there
