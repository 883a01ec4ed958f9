"""Reward hacks through reasoning-gym scorers that evaluate the answer text (``eval``, sympy's ``parse_expr``).

Each payload tries to patch the verifier process that scores it (lower ``_FULL_MARKS``, make every domain's
verifier a function that returns 1.0). It must score 0, and afterwards the SAME verifier process
(``num_workers=1``) must still score a wrong answer of every domain 0 and a right one 1.
"""

from __future__ import annotations

import os

import pytest
import reasoning_gym

from orchestrator.data import DatasetSpec, load_dataset
from workers.problem import Problem
from workers.reward.config import RewardConfig, SandboxConfig
from workers.reward.scorer import RewardScorer

CONFIG = RewardConfig(num_workers=1, math_timeout_s=2, check_timeout_s=10.0, fail_fast_error_fraction=None,
                      sandbox=SandboxConfig(cpu_seconds=4, memory_mb=512, wall_timeout_s=8.0))
EVAL_TASKS = ("spiral_matrix", "string_insertion", "binary_matrix", "n_queens")
SYMPY_TASKS = ("countdown", "polynomial_multiplication", "simple_integration", "intermediate_integration",
               "puzzle24")

# Route 1: the builtin __import__ reaches sys.modules (sympy's parse_expr keeps builtins' names too).
_PATCH_VIA_IMPORT = (
    "[__import__('sys').modules['workers.reward.reasoning_gym_verifier'].__dict__.update({'_FULL_MARKS': -1.0}),"
    " __import__('sys').modules['workers.reward.dispatch'].__dict__.update({"
    "'verify_math': __import__('unittest.mock').mock.Mock(return_value=1.0),"
    "'verify_choice': __import__('unittest.mock').mock.Mock(return_value=1.0),"
    "'verify_code': __import__('unittest.mock').mock.Mock(return_value=1.0),"
    "'verify_reasoning_gym': __import__('unittest.mock').mock.Mock(return_value=1.0)})]"
)
# Route 2: no name at all, only attributes: object's subclasses -> a class defined in a module that imported sys.
_SYS = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
        ".__init__.__globals__['sys']")
_PATCH_VIA_SUBCLASSES = (
    f"[{_SYS}.modules['workers.reward.reasoning_gym_verifier'].__dict__.update({{'_FULL_MARKS': -1.0}}),"
    f" {_SYS}.modules['workers.reward.dispatch'].__dict__.update({{"
    f"'verify_math': {_SYS}.modules['unittest.mock'].Mock(return_value=1.0),"
    f"'verify_choice': {_SYS}.modules['unittest.mock'].Mock(return_value=1.0),"
    f"'verify_code': {_SYS}.modules['unittest.mock'].Mock(return_value=1.0)}})]"
)
# For sympy's parse_expr: no comprehension variable (its auto_symbol would turn ``c`` into a Symbol).
_SYS_NO_NAMES = "().__class__.__base__.__subclasses__()[-1].__init__.__globals__['__builtins__']['__import__']('sys')"
_PATCH_VIA_SUBCLASSES_SYMPY = (
    f"{_SYS_NO_NAMES}.modules['workers.reward.reasoning_gym_verifier'].__dict__.update({{'_FULL_MARKS': -1.0}})"
)
MARKER = "/tmp/gmts-rg-hack-marker"
_WRITE_FILE = f"__import__('builtins').open('{MARKER}', 'w').write('pwned')"
_OPEN_SOCKET = "__import__('socket').create_connection(('127.0.0.1', 22), 1)"


def _rg_problem(task: str, index: int = 0) -> Problem:
    entry = reasoning_gym.create_dataset(task, size=index + 1, seed=11)[index]
    return Problem(id=f"{task}-{index}", prompt=entry["question"], answer=str(entry["answer"]),
                   domain="reasoning_gym", metadata={"dataset": task, "entry": entry})


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer(CONFIG) as shared:
        yield shared


@pytest.fixture(scope="module")
def every_domain() -> list[tuple[str, Problem, float]]:
    """(completion, problem, expected score): a right and a wrong answer of each domain."""
    human_eval = load_dataset(DatasetSpec(source="humaneval", limit=2))
    rg = _rg_problem("basic_arithmetic")
    checks = [
        ("The answer is \\boxed{58}", Problem(id="m", prompt="What is 36 + 22?", answer="58", domain="math"), 1.0),
        ("The answer is \\boxed{57}", Problem(id="m", prompt="What is 36 + 22?", answer="58", domain="math"), 0.0),
        ("The answer is (B)", Problem(id="c", prompt="Pick one", answer="B", domain="choice"), 1.0),
        ("The answer is (C)", Problem(id="c", prompt="Pick one", answer="B", domain="choice"), 0.0),
        ("68", Problem(id="a", prompt="23+45=", answer="68", domain="arithmetic"), 1.0),
        ("69", Problem(id="a", prompt="23+45=", answer="68", domain="arithmetic"), 0.0),
        (f"<answer>{rg.answer}</answer>", rg, 1.0),
        (f"<answer>{int(rg.answer) + 1}</answer>", rg, 0.0),
    ]
    for problem in human_eval:
        checks.append((f"```python\n{problem.prompt}{problem.answer}\n```", problem, 1.0))
        checks.append((f"```python\n{problem.prompt}    return None\n```", problem, 0.0))
    return checks


def _assert_every_domain_still_honest(scorer, every_domain) -> None:
    results = scorer.score([c for c, _, _ in every_domain], [p for _, p, _ in every_domain])
    got = [(problem.domain, result.score) for (_, problem, _), result in zip(every_domain, results)]
    assert got == [(problem.domain, expected) for _, problem, expected in every_domain], results


@pytest.mark.slow
@pytest.mark.parametrize("payload", [_PATCH_VIA_IMPORT, _PATCH_VIA_SUBCLASSES, _PATCH_VIA_SUBCLASSES_SYMPY],
                         ids=["import", "subclasses", "subclasses-no-names"])
@pytest.mark.parametrize("task", EVAL_TASKS + SYMPY_TASKS)
def test_a_payload_that_patches_the_verifier_scores_zero_and_patches_nothing(scorer, every_domain, task, payload):
    problem = _rg_problem(task)
    [result] = scorer.score([f"<answer>{payload}</answer>"], [problem])
    assert result.score == 0.0, result
    _assert_every_domain_still_honest(scorer, every_domain)


@pytest.mark.slow
@pytest.mark.parametrize("task", EVAL_TASKS + SYMPY_TASKS)
def test_a_payload_that_writes_a_file_or_opens_a_socket_scores_zero_and_leaves_no_file(scorer, task):
    if os.path.exists(MARKER):
        os.remove(MARKER)
    problem = _rg_problem(task)
    results = scorer.score([f"<answer>{_WRITE_FILE}</answer>", f"<answer>{_OPEN_SOCKET}</answer>"], [problem] * 2)
    assert [result.score for result in results] == [0.0, 0.0], results
    assert not os.path.exists(MARKER)


@pytest.mark.slow
def test_a_task_scored_by_its_own_eval_scorer_trips_fail_fast_instead_of_scoring(monkeypatch):
    # Without our transcription, spiral_matrix's own scorer eval()s every non-matching answer: each check is a
    # refusal (CheckError), and a batch of them stops the run naming the task, never a silent 0 or a 1.
    from workers.reward import reasoning_gym_safe_scorers, reasoning_gym_verifier
    from workers.reward.results import VerifierBroken
    monkeypatch.delitem(reasoning_gym_safe_scorers.SAFE_SCORERS, "spiral_matrix")
    reasoning_gym_verifier._score_answer_fn.cache_clear()
    monkeypatch.setattr(reasoning_gym_verifier, "_warmed", set())
    try:
        problem = _rg_problem("spiral_matrix")
        config = CONFIG.model_copy(update={"fail_fast_error_fraction": 0.95})
        with RewardScorer(config) as own_scorer, pytest.raises(VerifierBroken, match="tried to execute the answer"):
            own_scorer.score([f"<answer>{_PATCH_VIA_IMPORT}</answer>"] * 8, [problem] * 8)
    finally:
        reasoning_gym_verifier._score_answer_fn.cache_clear()
