import threading
import time

import pytest

from workers.problem import Problem
from workers.reward.math_verifier import final_answer_candidates, verify_math
from workers.reward.results import CheckError, CheckTimeout


def _math(answer: str) -> Problem:
    return Problem(id="math-1", prompt="What is 36 + 22?", answer=answer, domain="math")


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("36 + 22 = 58", "58"),  # restates the question: the answer is after the last '='
        ("First 36 + 20 = 56, then 56 + 2 = 58", "58"),
        ("The answer is 58.", "58"),
        ("Answer: 58 apples", "58"),
        ("Adding them gives 58 apples in total", "58"),  # last number
        ("\\boxed{58} (I double-checked: 57 was wrong)", "58"),  # \boxed beats later numbers
        ("\\boxed{0.5}", "\\frac{1}{2}"),  # fractions compare symbolically
        ("So the answer is $\\frac{1}{2}$", "\\frac{1}{2}"),
        ("x = 1/2", "\\frac{1}{2}"),
        ("so d = 3\\sqrt{2}.", "3\\sqrt{2}"),  # bare LaTeX after '='
        ("\\boxed{\\sqrt{2} \\cdot 3}", "3\\sqrt{2}"),
        ("$\\frac{1+\\sqrt{5}}{2}$", "\\frac{1+\\sqrt{5}}{2}"),  # a last line that is one formula
        ("She pays 1,000 dollars", "1000"),
        ("it drops to -7 degrees", "-7"),
        ("\\boxed{\\frac{\\pi}{2}}", "$\\frac{\\pi}{2}$"),  # reference already in $…$
    ],
)
def test_correct_final_answers_score_one(completion, answer):
    assert verify_math(completion, _math(answer)) == 1.0


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("36 + 22 = 57", "58"),  # the question's numbers must not count as the answer
        ("What is 36 + 22?", "58"),  # an echo of the question is no answer (last number: 22)
        ("I think 58, no wait, 59", "58"),
        ("\\boxed{59}", "58"),
        ("\\boxed{57} although 58 is tempting", "58"),
        ("", "58"),
        ("no idea", "58"),
        ("\\boxed{0.4}", "\\frac{1}{2}"),
        ("\\boxed{58", "58"),  # a truncated box commits to nothing (a box decides alone)
        # Not stated values (stated_value.RULES): the verifier would do the arithmetic.
        ("So the answer is $\\frac{2}{4}$", "\\frac{1}{2}"),
        ("\\boxed{\\sqrt{18}}", "3\\sqrt{2}"),
        ("\\boxed{9^{9^{9^{9}}}}", "5"),
    ],
)
def test_wrong_or_missing_answers_score_zero(completion, answer):
    assert verify_math(completion, _math(answer)) == 0.0


def test_candidates_are_ordered_box_then_phrase_then_equals_then_last_number():
    assert final_answer_candidates("3 + 4 = 7; the answer is 7 of 9") == [" 7 of 9", " 7; the answer is 7 of 9", "9"]
    assert final_answer_candidates("3 + 4 = 7 so \\boxed{7}")[0] == "\\boxed{7}"


def test_unparsable_reference_is_an_error_not_a_zero():
    with pytest.raises(CheckError, match="reference answer"):
        verify_math("58", _math(""))


@pytest.mark.slow
def test_pathological_answer_times_out_within_the_limit():
    started = time.monotonic()
    with pytest.raises(CheckTimeout, match="1 s limit"):
        # Against an expression reference the tower reaches math-verify's comparison (a value reference refuses it
        # before: not a stated value).
        verify_math("\\boxed{9^{9^{9^{9}}}}", _math("x + 5"), timeout_s=1)
    assert time.monotonic() - started < 2.5


def test_refuses_to_run_off_the_main_thread():
    # math-verify's signal.alarm raises off the main thread and it would then score 0 silently.
    outcome = {}

    def run():
        try:
            verify_math("58", _math("58"))
        except CheckError as error:
            outcome["error"] = str(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert "main thread" in outcome["error"]
