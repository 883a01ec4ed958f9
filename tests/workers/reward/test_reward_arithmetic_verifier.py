import pytest

from workers.problem import Problem
from workers.reward.arithmetic_verifier import verify_arithmetic
from workers.reward.results import CheckError


def _sum(answer: str) -> Problem:
    return Problem(id="add-1", prompt="23+45=", answer=answer, domain="arithmetic")


@pytest.mark.parametrize("completion", ["68", "68\n", " 68", "68<eos>", "68=12+3", "68 99", "068"])
def test_leading_integer_equal_to_the_answer_scores_one(completion):
    assert verify_arithmetic(completion, _sum("68")) == 1.0


@pytest.mark.parametrize("completion", ["67", "6", "686", "x68", "", "=68", "-68", "the sum is 68"])
def test_anything_else_scores_zero(completion):
    # The leading integer is the answer: "the sum is 68" does not start with one.
    assert verify_arithmetic(completion, _sum("68")) == 0.0


def test_negative_answers_and_zero():
    assert verify_arithmetic("-5junk", _sum("-5")) == 1.0
    assert verify_arithmetic("0", _sum("-0")) == 1.0
    assert verify_arithmetic("5", _sum("-5")) == 0.0


def test_runaway_digit_string_scores_zero_without_error():
    assert verify_arithmetic("9" * 100_000, _sum("68")) == 0.0


def test_non_integer_reference_is_an_error():
    with pytest.raises(CheckError, match="non-integer"):
        verify_arithmetic("68", _sum("68.5"))
