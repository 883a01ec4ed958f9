import pytest
import reasoning_gym

from workers.problem import Problem
from workers.reward.reasoning_gym_verifier import submitted_answer, verify_reasoning_gym
from workers.reward.results import CheckError


@pytest.fixture(scope="module")
def entry() -> dict:
    return reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=7)[0]


def _problem(entry: dict, **metadata) -> Problem:
    return Problem(id="rg-1", prompt=entry["question"], answer=entry["answer"], domain="reasoning_gym",
                   metadata={"dataset": "basic_arithmetic", "entry": entry, **metadata})


def test_tagged_answer_is_scored_by_the_task(entry):
    assert verify_reasoning_gym(f"Thinking…\n<answer>{entry['answer']}</answer>", _problem(entry)) == 1.0


def test_boxed_and_last_line_answers_are_accepted(entry):
    assert verify_reasoning_gym(f"so \\boxed{{{entry['answer']}}}", _problem(entry)) == 1.0
    assert verify_reasoning_gym(f"Let me compute.\n{entry['answer']}\n", _problem(entry)) == 1.0


def test_wrong_answer_scores_zero(entry):
    wrong = str(int(entry["answer"]) + 1)
    assert verify_reasoning_gym(f"<answer>{wrong}</answer>", _problem(entry)) == 0.0
    assert verify_reasoning_gym("", _problem(entry)) == 0.0


def test_later_tag_wins():
    assert submitted_answer("<answer>1</answer> wait <answer>2</answer>") == "2"


def test_missing_metadata_and_unknown_task_are_errors(entry):
    bare = Problem(id="rg-2", prompt="q", answer="1", domain="reasoning_gym")
    with pytest.raises(CheckError, match="metadata"):
        verify_reasoning_gym("<answer>1</answer>", bare)
    unknown = Problem(id="rg-3", prompt="q", answer="1", domain="reasoning_gym",
                      metadata={"dataset": "no_such_task", "entry": entry})
    with pytest.raises(CheckError, match="no_such_task"):
        verify_reasoning_gym("<answer>1</answer>", unknown)


def test_a_refused_task_is_an_error_naming_why(entry):
    composite = Problem(id="rg-4", prompt="q", answer="1", domain="reasoning_gym",
                        metadata={"dataset": "composite", "entry": entry})
    with pytest.raises(CheckError, match="'composite' is refused"):
        verify_reasoning_gym("<answer>1</answer>", composite)
