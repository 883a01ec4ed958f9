"""One completion to one verifier, chosen by the problem's domain; and the set-up of a verifier process."""

from __future__ import annotations

import logging
import math

from workers.problem import Problem
from workers.reward.arithmetic_verifier import verify_arithmetic
from workers.reward.choice_verifier import verify_choice
from workers.reward.code_verifier import verify_code
from workers.reward.config import RewardConfig
from workers.reward.math_verifier import verify_math
from workers.reward.reasoning_gym_verifier import verify_reasoning_gym
from workers.reward.sandbox import isolation_plan_for

# Headroom of the hard limit of a code check over the sandbox's own wall clock: interpreter start,
# namespace set-up and clean-up happen outside the sandbox's timer.
CODE_CHECK_GRACE_S = 5.0
VERIFIER_NAMES = {"math": "verify_math", "code": "verify_code", "choice": "verify_choice",
                  "arithmetic": "verify_arithmetic", "reasoning_gym": "verify_reasoning_gym"}
# Domains checked in the scorer's own process, not in a verifier process. Only a check that cannot hang and
# runs nothing of the completion belongs here: the arithmetic check is one anchored, linear-time regex and a
# prefix test on a string. For such a check the process round trip costs 30× the check itself (measured on
# 1,024 toy answers: 0.13 s through two verifier processes, 0.004 s in process), and a hard deadline buys
# nothing. Everything else (sympy, the code sandbox, the many-regex choice and reasoning-gym rules) keeps its
# killable process.
IN_PROCESS_DOMAINS = frozenset({"arithmetic"})


def verify_completion(completion: str, problem: Problem, config: RewardConfig) -> float:
    """The reward of ``completion`` for ``problem`` in [0, 1]; raises ``CheckError`` when it cannot judge."""
    match problem.domain:
        case "math":
            return verify_math(completion, problem, timeout_s=config.math_timeout_s)
        case "code":
            return verify_code(completion, problem, sandbox=config.sandbox)
        case "choice":
            return verify_choice(completion, problem)
        case "arithmetic":
            return verify_arithmetic(completion, problem)
        case "reasoning_gym":
            return verify_reasoning_gym(completion, problem, partial_credit=config.reasoning_gym_partial_credit,
                                        cpu_seconds=max(1, math.ceil(config.check_timeout_s)))
    raise ValueError(f"problem {problem.id}: no verifier for domain {problem.domain!r}")


def check_deadline_s(problem: Problem, config: RewardConfig) -> float:
    """Wall-clock limit past which the process running this check is killed."""
    if problem.domain == "code":
        return config.sandbox.wall_timeout_s + CODE_CHECK_GRACE_S
    return config.check_timeout_s


def prepare_verifier_process(config: RewardConfig) -> None:
    """Runs once in each verifier process, before its first check."""
    # math-verify logs every timeout and parse failure at ERROR level with the whole completion in the
    # message; the scorer records timeouts itself, so keep only its critical messages.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    probe_sandbox(config)


def probe_sandbox(config: RewardConfig) -> None:
    """Find the sandbox layers available here now, not inside the first code check's time limit.

    The result is cached per process; forked verifier processes inherit the parent's.
    """
    isolation_plan_for(config.sandbox)
