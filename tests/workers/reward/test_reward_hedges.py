"""Hedged answers earn nothing: listing candidates, empty boxes, echoing the question, digit floods.

Each case runs the real verifier (math-verify included); each has a committed-answer twin that scores 1,
so a 0 means the hedge was caught, not that the answer was unreadable.
"""

import pytest
import reasoning_gym

from workers.problem import Problem
from workers.reward.arithmetic_verifier import verify_arithmetic
from workers.reward.choice_verifier import verify_choice
from workers.reward.math_verifier import verify_math
from workers.reward.reasoning_gym_verifier import verify_reasoning_gym

MATH = Problem(id="m", prompt="What is 7 times 6? Think step by step.", answer="42", domain="math")
CHOICE = Problem(id="c", prompt="Which gas do plants absorb?\nA) oxygen B) carbon dioxide C) helium D) argon",
                 answer="B", domain="choice")


@pytest.mark.parametrize("hedge", [
    "\\boxed{41} \\boxed{42}", "\\boxed{42} and maybe \\boxed{43}", "\\boxed{41, 42}", "\\boxed{41 or 42}",
    "\\boxed{42 \\text{ or } 43}", "\\boxed{41 \\lor 42}", "\\boxed{41 \\vee 42}", "\\boxed{41 \\\\ 42}",
    "\\boxed{41 \\& 42}", "\\boxed{41;42}", "\\boxed{\\pm 42}", "\\boxed{\\{41, 42\\}}", "\\boxed{}",
    "the answer is 41 or 42", "The answer is 41, 42.", "answer: 40, 41, 42", "$41$ or $42$", "41, 42",
    "What is 7 times 6? Think step by step.", "4" * 5000, "42" + "0" * 60, "\\boxed{42" + "0" * 400 + "}",
    "\\boxed{42.00000000000000000000000000000000000000000001}",
])
def test_math_hedges_score_zero(hedge):
    assert verify_math(hedge, MATH) == 0.0


@pytest.mark.parametrize("committed", [
    "\\boxed{42}", "7 * 6 = 42, so \\boxed{42}. Final: \\boxed{ 42 }", "The answer is 42, since 7 * 6 = 42.",
    "What is 7 times 6? Think step by step.\n7 times 6 is 42", "so 6 * 7 = 42 and we are done", "\\boxed{x = 42}",
])
def test_math_committed_answers_still_score_one(committed):
    assert verify_math(committed, MATH) == 1.0


def test_math_set_references_still_accept_sets():
    problem = Problem(id="s", prompt="Solve x^2 = 1.", answer="\\{-1, 1\\}", domain="math")
    assert verify_math("\\boxed{\\{1, -1\\}}", problem) == 1.0
    assert verify_math("\\boxed{1}", problem) == 0.0


@pytest.mark.parametrize("hedge", [
    "A B C D", "A or B", "B or A", "the answer is A or B", "The answer is B or C.", "The answer is (B), (C)",
    "\\boxed{A} \\boxed{B}", "\\boxed{A, B}", "\\boxed{B, C}", "\\boxed{}", "\\boxed{AB}", "(A) (B)", "A, B",
    "B/C", "A) oxygen B) carbon dioxide C) helium D) argon", CHOICE.prompt, "ABCD",
])
def test_choice_hedges_score_zero(hedge):
    assert verify_choice(hedge, CHOICE) == 0.0


@pytest.mark.parametrize("committed", [
    "B", "\\boxed{B}", "The answer is (B).", "Answer: B", "Oxygen is A, which plants release. So B",
    CHOICE.prompt + "\nThe answer is B.", "\\boxed{B} as I said: \\boxed{(B)}",
])
def test_choice_committed_answers_still_score_one(committed):
    assert verify_choice(committed, CHOICE) == 1.0


def test_arithmetic_echo_and_digit_flood_score_zero():
    problem = Problem(id="a", prompt="23+0=", answer="23", domain="arithmetic")
    assert verify_arithmetic("23", problem) == 1.0
    assert verify_arithmetic("23+0=23", problem) == 0.0  # its leading integer is the question's
    assert verify_arithmetic("23" + "0" * 10000, problem) == 0.0


def test_reasoning_gym_pays_no_partial_credit_for_listing_candidates():
    entry = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=3)[0]
    problem = Problem(id="rg", prompt=entry["question"], answer=entry["answer"], domain="reasoning_gym",
                      metadata={"dataset": "basic_arithmetic", "entry": entry})
    listing = f"<answer>{entry['answer']} 1 2 3 4 5 6 7 8 9</answer>"
    # The task's own scorer pays for an answer that merely contains the gold one …
    assert 0 < verify_reasoning_gym(listing, problem, partial_credit=True) < 1
    # … the default pays full marks only.
    assert verify_reasoning_gym(listing, problem) == 0.0
    assert verify_reasoning_gym(f"<answer>{entry['answer']}</answer>", problem) == 1.0
    assert verify_reasoning_gym(entry["question"], problem) == 0.0  # the question echoed back
