"""The math verifier pays for a stated value, never for arithmetic it would do itself (stated_value.RULES).

Over whole splits of every shipped math and arithmetic data set: each restatement of a problem — a computation
copied out of its question, or GSM8K's last worked calculation left unevaluated — scores 0 in five forms, and
the reference in the same five forms scores 1. Plus the attacks found by hand, each kept as a case.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

from orchestrator.data import DatasetSpec, load_dataset
from tests.workers.reward.restatements import answer_forms, restatements
from workers.problem import Problem
from workers.reward.math_verifier import verify_math
from workers.reward.results import CheckError

# References math-verify cannot read as what they say: the verifier refuses to judge them (an error, counted,
# never a reward). cnmo-17's "λ = 2√2, A(±1, 0)" parses as the number 0, so "\boxed{0}" would have paid.
UNREADABLE_REFERENCES = {"cnmo-17"}
QUESTION_ARITHMETIC = {"style": "question", "operations": ["+", "-", "*"]}
# Every shipped math-domain set (packaged benchmarks and the chat-style arithmetic of cpu-smollm2-arith and
# benchmarks/real_model_tasks.py), whole splits; the slow ones run in CI only.
DATA_SETS = {
    "math500": DatasetSpec(source="math500"),
    "aime24": DatasetSpec(source="aime24"),
    "aime25": DatasetSpec(source="aime25"),
    "aime25_full": DatasetSpec(source="aime25_full"),
    "cnmo": DatasetSpec(source="cnmo"),
    **{f"smollm2-arith-{split}": DatasetSpec(source="arithmetic", split=split, arithmetic={
        **QUESTION_ARITHMETIC, "digits": 1, "test_fraction": 0.5, "validation_fraction": 0.0})
       for split in ("train", "test")},
}
SLOW_DATA_SETS = {
    "gsm8k": DatasetSpec(source="gsm8k"),
    "arith-2digit-times-test": DatasetSpec(source="arithmetic", split="test", arithmetic={
        **QUESTION_ARITHMETIC, "digits": 2, "operations": ["*"]}),
}


def _restatements_and_references(problems: list[Problem]) -> tuple[list, list, int]:
    paid, missed, tried = [], [], 0
    for problem in problems:
        for restated in restatements(problem):
            tried += 1
            paid += [(problem.id, form) for form in answer_forms(restated, problem) if verify_math(form, problem)]
        missed += [(problem.id, form) for form in answer_forms(problem.answer, problem)
                   if verify_math(form, problem) != 1.0]
    return paid, missed, tried


def _checked_in_two_processes(problems: list[Problem]) -> tuple[list, list, int]:
    """Every problem checked, half in each of two processes: math-verify's sympy work is single-threaded (a whole
    GSM8K split is a minute of one core). Fresh interpreters (spawn), not forks of this threaded test process."""
    halves = [problems[0::2], problems[1::2]]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(_restatements_and_references, halves))
    return ([*results[0][0], *results[1][0]], [*results[0][1], *results[1][1]], results[0][2] + results[1][2])


@pytest.mark.slow  # every problem of each data set, through math-verify
@pytest.mark.parametrize("name", [*DATA_SETS, *SLOW_DATA_SETS])
def test_restating_the_problem_never_pays_and_the_reference_always_does(name):
    problems = load_dataset({**DATA_SETS, **SLOW_DATA_SETS}[name])
    for problem in (p for p in problems if p.id in UNREADABLE_REFERENCES):
        with pytest.raises(CheckError, match="drops part of it"):
            verify_math("\\boxed{0}", problem)
    # Two processes pay off only for the large splits: each costs an interpreter importing sympy (≈ 5 s).
    check = _checked_in_two_processes if name in SLOW_DATA_SETS else _restatements_and_references
    paid, missed, tried = check([p for p in problems if p.id not in UNREADABLE_REFERENCES])
    assert not paid, f"{len(paid)} restatements paid, e.g. {paid[:5]}"
    assert not missed, f"{len(missed)} forms of the reference scored 0, e.g. {missed[:5]}"
    if name.startswith(("smollm2", "arith", "gsm8k")):
        assert tried >= len(problems)  # every question holds a computation (GSM8K: its worked solution's last)


QUESTION = Problem(id="q", prompt="What is 7 * 8?", answer="56", domain="math")


@pytest.mark.parametrize("restated", [
    "The answer is 7 * 8.", "\\boxed{7 * 8}", "7 * 8", "= 7 * 8", "\\boxed{7 \\times 8}", "$7 \\cdot 8$",
    "\\boxed{\\frac{112}{2}}", "\\boxed{56/1}", "\\boxed{8 \\cdot 7 + 0}", "The answer is 2^3 \\cdot 7.",
    "What is 7 * 8?\nFinal answer: 7 * 8",
])
def test_an_expression_for_the_value_scores_zero(restated):
    assert verify_math(restated, QUESTION) == 0.0


@pytest.mark.parametrize("stated", ["56", "The answer is 56.", "\\boxed{56}", "= 56", "7 * 8 = 56",
                                    "\\boxed{7 \\times 8 = 56}", "What is 7 * 8?\nFinal answer: 56"])
def test_the_value_in_every_form_scores_one(stated):
    assert verify_math(stated, QUESTION) == 1.0


@pytest.mark.parametrize(("answer", "reference"), [
    ("\\boxed{99^2+99+1}", "9901"), ("\\boxed{(16-3-4)*2}", "18"), ("\\boxed{\\binom{5}{2}}", "10"),
    ("\\boxed{3!}", "6"), ("\\boxed{\\sqrt{49}}", "7"), ("\\boxed{\\sqrt{18}}", "3\\sqrt{2}"),
    ("\\boxed{\\frac{4}{8}}", "\\frac{1}{2}"), ("\\boxed{1 + 1 + \\sqrt{3}}", "2+\\sqrt{3}"),
    ("The answer is 20*.25.", "5"), ("40-20", "20"), ("2^8=4^x", "4"), ("The answer is 1^{(2^{235423523})}.", "1"),
    ("$4+\\frac{12}{a}+\\frac{36}{a^2}+\\cdots$", "4"),
])
def test_unevaluated_arithmetic_and_extraction_slips_score_zero(answer, reference):
    assert verify_math(answer, Problem(id="p", prompt="q", answer=reference, domain="math")) == 0.0


@pytest.mark.parametrize(("answer", "reference"), [
    ("\\boxed{2+\\sqrt{3}}", "2+\\sqrt{3}"), ("\\boxed{\\frac{1+\\sqrt{5}}{2}}", "\\frac{1+\\sqrt{5}}{2}"),
    ("\\boxed{3\\sqrt{2}}", "3\\sqrt{2}"), ("\\boxed{2\\pi}", "2\\pi"), ("\\boxed{-0.75}", "-\\frac{3}{4}"),
    ("\\boxed{25\\%}", "25\\%"), ("\\boxed{[1,3)}", "[1,3)"), ("\\boxed{0.33}", "\\frac{1}{3}"),
    # A reference written as an expression keeps symbolic equality: its form is the answer.
    ("\\boxed{2^{100}}", "2^{100}"), ("\\boxed{1+x^2}", "x^2+1"),
])
def test_stated_values_and_expression_references_still_score_one(answer, reference):
    assert verify_math(answer, Problem(id="p", prompt="q", answer=reference, domain="math")) == 1.0


@pytest.mark.parametrize("hedge", [
    "\\boxed{3 | 7}", "\\boxed{3 ∨ 7}", "\\boxed{3 ∪ 7}", "\\boxed{3，7}", "\\boxed{3 \\to 7}", "\\boxed{3 = 7}",
    "The answer is 3 = 7.", "The answer is not 3, it is 7.", "\\boxed{3 \\neq 7}", "\\boxed{3 → 7}",
])
def test_listing_or_negating_values_scores_zero(hedge):
    # Each pays the last value under math-verify alone; 7 is the reference.
    assert verify_math(hedge, Problem(id="h", prompt="q", answer="7", domain="math")) == 0.0


def test_rationals_compare_exactly_not_to_six_places():
    tiny = Problem(id="t", prompt="q", answer="\\frac{1}{3000000}", domain="math")
    assert verify_math("\\boxed{0.0}", tiny) == 0.0
    assert verify_math("\\boxed{\\frac{1}{3000000}}", tiny) == 1.0
    third = Problem(id="t", prompt="q", answer="\\frac{1}{3}", domain="math")
    assert verify_math("\\boxed{0.3}", third) == 0.0  # one place: too coarse to be the value
