"""Arithmetic domain: the character-level toy task ("23+45=" → "68").

Rule: the completion's *leading* integer (after optional whitespace, with an optional sign) must
equal ``problem.answer`` as an integer. The prompt already ends in "=", so the model's first token
is the answer; whatever follows (an end marker, junk after it) is ignored. A completion that does
not start with an integer scores 0, and so does one that starts by repeating the question ("23+0=…":
its leading integer would be the question's). A digit flood cannot win: the integer must equal the
reference exactly.

Worked answers (``metadata["worked"]``, orchestrator/data/worked_addition.py): the completion, up to trailing
whitespace, must be the reference's written-out sum character for character. The procedure is the task there: a
right final sum after a wrong or missing column scores 0, and nothing but the exact text pays.
"""

from __future__ import annotations

import re

from workers.problem import Problem
from workers.reward.results import CheckError

_LEADING_INTEGER = re.compile(r"\s*([+-]?)(\d+)")


def verify_arithmetic(completion: str, problem: Problem) -> float:
    """1.0 if the completion's leading integer equals ``problem.answer`` (a worked problem: if the completion is
    its written-out answer), else 0.0."""
    if problem.metadata.get("worked"):
        return 1.0 if completion.rstrip() == problem.answer else 0.0
    gold = _LEADING_INTEGER.fullmatch(problem.answer.strip())
    if gold is None:
        raise CheckError(f"arithmetic problem {problem.id} has non-integer answer {problem.answer!r}")
    return 1.0 if stated_integer(completion, problem.prompt) == _canonical(gold) else 0.0


def stated_integer(completion: str, prompt: str) -> str | None:
    """The completion's leading integer as the verifier compares it ("068" → "68"); None when it has none or
    starts by repeating the question."""
    if prompt.strip() and completion.lstrip().startswith(prompt.strip()):
        return None
    answer = _LEADING_INTEGER.match(completion)
    return None if answer is None else _canonical(answer)


def _canonical(integer: re.Match[str]) -> str:
    # Compared as text, not int(): a runaway digit string must not hit Python's 4300-digit int() limit.
    digits = integer.group(2).lstrip("0") or "0"
    return digits if integer.group(1) != "-" or digits == "0" else "-" + digits
