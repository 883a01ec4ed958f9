"""Our transcriptions of the reasoning-gym scorers that evaluate text score benign answers exactly as the
tasks' own scorers do, and never run an answer."""

from __future__ import annotations

import json

import pytest
import reasoning_gym

from workers.reward import reasoning_gym_verifier
from workers.reward.reasoning_gym_safe_scorers import SAFE_SCORERS, UnsafeAnswer, literal_value, sympy_value

N_ENTRIES = 50
# sympy.simplify on every near miss: intermediate_integration's scorer takes seconds per entry, so it is
# compared on fewer entries (each still with every near miss).
ENTRIES_PER_TASK = {"intermediate_integration": 10}
PAYLOADS = [
    "__import__('sys').modules['workers.reward.reasoning_gym_verifier'].__dict__.update({'_FULL_MARKS': -1.0})",
    "().__class__.__base__.__subclasses__()[-1].__init__.__globals__['__builtins__']['__import__']('os')"
    ".system('touch /tmp/gmts-safe-scorer-marker')",
    "[c for c in ().__class__.__mro__[1].__subclasses__()]",
    "Symbol('x').__class__.__mro__",
    "(lambda: 1)()",
    "9**9**9**9",
    "factorial(10**9)",
    "x" + "+x" * 5000,
    "(" * 500 + "1" + ")" * 500,
]


def _near_misses(task: str, gold: str) -> list[str | None]:
    """The gold, its list/matrix forms (the partial-credit branches) and answers one slip away."""
    rows = gold.split("\n")
    candidates = [gold, gold + " ", " " + gold, gold.replace("1", "2"), gold.replace("2", "1", 1), gold[:-1],
                  gold.replace("**", "^"), gold.replace(" + C", ""), gold.replace("*", " * "), gold.replace(" ", ""),
                  str(gold.split()), str([int(v) if v.lstrip("-").isdigit() else v for v in gold.split()]),
                  str([row.split() for row in rows]), str([[int(v) for v in row.split() if v.lstrip("-").isdigit()]
                                                           for row in rows]),
                  str(list(gold)), json.dumps(gold.split()), "0", "", None, "x", "[1, 2]", "1 2 3", "(24)"]
    return candidates


@pytest.mark.slow  # each task's own scorer in the scoring jail, on many generated entries
@pytest.mark.parametrize("task", list(SAFE_SCORERS))
def test_the_transcription_scores_like_the_task_s_own_scorer(task):
    own = reasoning_gym.get_score_answer_fn(task)
    safe = SAFE_SCORERS[task]
    compared = 0
    entries = ENTRIES_PER_TASK.get(task, N_ENTRIES)
    for entry in reasoning_gym.create_dataset(task, size=entries, seed=23):
        gold = str(entry["answer"])
        for answer in _near_misses(task, gold):
            if task == "intermediate_integration" and "Integral" in (answer or ""):
                continue  # deliberately refused (the module's docstring): restating the question pays nothing
            assert safe(own.__self__, answer, entry) == own(answer=answer, entry=entry), (task, answer, entry)
            compared += 1
    assert compared >= entries * 10


@pytest.mark.slow
def test_the_gold_answers_get_full_marks():
    for task, safe in SAFE_SCORERS.items():
        own = reasoning_gym.get_score_answer_fn(task)
        for entry in reasoning_gym.create_dataset(task, size=5, seed=3):
            if "Integral" not in str(entry["answer"]):
                assert safe(own.__self__, str(entry["answer"]), entry) == 1.0, (task, entry["answer"])


def test_restating_an_integral_pays_nothing():
    own = reasoning_gym.get_score_answer_fn("intermediate_integration")
    entry = reasoning_gym.create_dataset("intermediate_integration", size=1, seed=1)[0]
    restated = f"Integral({entry['metadata']['integrand']}, {entry['metadata']['variable']}) + C"
    assert own(answer=restated, entry=entry) == 1.0  # the task's own scorer pays for it
    assert SAFE_SCORERS["intermediate_integration"](own.__self__, restated, entry) == 0.0


@pytest.mark.parametrize("task", sorted(SAFE_SCORERS))
def test_payloads_score_below_full_marks_and_run_nothing(task, tmp_path):
    own = reasoning_gym.get_score_answer_fn(task)
    entry = reasoning_gym.create_dataset(task, size=1, seed=5)[0]
    for payload in PAYLOADS:
        assert SAFE_SCORERS[task](own.__self__, payload, entry) < 1.0, payload
    assert reasoning_gym_verifier._FULL_MARKS > 0.99


def test_the_parsers_build_values_without_running_code():
    assert literal_value("[[1, 2], [3]]") == [[1, 2], [3]]
    with pytest.raises(ValueError):
        literal_value("__import__('os')")
    assert str(sympy_value("2*x**2 + 3/4")) == "2*x**2 + 3/4"
    for text in ["__import__('os')", "x.__class__", "9**9**9", "factorial(10**6)", "Symbol('x').evalf()",
                 "lambda: 1", "[1, 2]", "x" * 3000]:
        with pytest.raises((UnsafeAnswer, SyntaxError, TypeError)):
            sympy_value(text, {"x": __import__("sympy").Symbol("x")})
