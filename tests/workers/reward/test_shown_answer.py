"""The shown answer is the part of a completion its domain's verifier judges (workers/reward/shown_answer.py)."""

import pytest
import reasoning_gym

from workers.problem import Problem
from workers.reward.arithmetic_verifier import verify_arithmetic
from workers.reward.math_verifier import verify_math
from workers.reward.shown_answer import MAX_SHOWN_CHARS, shown_answer, tail


def _math(answer: str = "58", prompt: str = "What is 36 + 22?") -> Problem:
    return Problem(id="m", prompt=prompt, answer=answer, domain="math")


@pytest.mark.parametrize(("completion", "shown"), [
    ("36 + 22 = 58", "58"),  # the restated question's numbers are not the answer
    ("First 30 + 20 = 50, then \\boxed{58}.", "58"),  # a box decides alone
    ("The answer is 58, since 36 + 22 = 58", "58"),
    ("It is \\boxed{57} or \\boxed{58}", ""),  # boxes that disagree commit to nothing
    ("I do not know", ""),
])
def test_math_shows_the_verifiers_final_answer(completion, shown):
    assert shown_answer(completion, _math()) == shown


def test_math_shown_answer_carries_the_reward_of_its_completion():
    problem = _math()
    for completion in ("So 36 + 22 = 58", "so \\boxed{58}", "36 + 22 = 57"):
        assert verify_math(shown_answer(completion, problem), problem) == verify_math(completion, problem)


def test_math_ignores_an_echo_of_the_question():
    problem = _math(prompt="Compute 12 * 7 and give the result as 84 or not.")
    assert shown_answer(problem.prompt + " I think 85", problem) == "85"


def test_choice_shows_the_chosen_letter():
    problem = Problem(id="c", prompt="Which one? (A) x (B) y (C) z", answer="C", domain="choice")
    assert shown_answer("Let me see. The answer is (B).", problem) == "B"
    assert shown_answer("A or B", problem) == ""


def test_arithmetic_shows_the_leading_integer_it_compares():
    problem = Problem(id="a", prompt="23+45=", answer="68", domain="arithmetic")
    assert shown_answer("068<eos>junk 12", problem) == "68"
    assert shown_answer("23+45=68", problem) == ""  # an echo of the question states nothing
    assert verify_arithmetic("068<eos>", problem) == 1.0 and verify_arithmetic("23+45=68", problem) == 0.0


def test_reasoning_gym_shows_what_the_task_scorer_gets():
    entry = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=7)[0]
    problem = Problem(id="rg", prompt=entry["question"], answer=entry["answer"], domain="reasoning_gym",
                      metadata={"dataset": "basic_arithmetic", "entry": entry})
    assert shown_answer("Thinking…\n<answer>41</answer>", problem) == "41"
    assert shown_answer("Let me compute.\n17\n", problem) == "17"


def test_code_shows_the_end_of_the_program_the_sandbox_runs():
    problem = Problem(id="c", prompt="def add(a, b):\n    \"\"\"Sum.\"\"\"\n", answer="", domain="code",
                      tests="def check(candidate):\n    assert candidate(1, 2) == 3\n",
                      metadata={"entry_point": "add"})
    fenced = "Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone, hope it helps."
    shown = shown_answer(fenced, problem)
    assert shown.endswith("def add(a, b):\n    return a + b") and "hope it helps" not in shown
    long = "    return a + b  # " + "x" * 1000
    assert len(shown_answer(long, problem)) == MAX_SHOWN_CHARS and shown_answer(long, problem).startswith("…")


def test_tail_keeps_short_text_and_the_end_of_long_text():
    assert tail("abc", 5) == "abc"
    assert tail("abcdefgh", 5) == "…efgh"
