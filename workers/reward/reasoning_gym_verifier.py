"""reasoning-gym domain: each procedural task scores answers with its own ``score_answer``.

``problem.metadata["dataset"]`` names the task and ``metadata["entry"]`` is the generated entry (a
dict with ``question``, ``answer``, ``metadata``). The answer handed to the scorer is, in order:
the last ``<answer>…</answer>`` (reasoning-gym's own prompt format), the last ``\\boxed{…}``, the
last non-empty line (after removing an echo of the question).

Only a full score counts unless ``partial_credit`` is on: many tasks' scorers pay for listing
candidates (the default ``score_answer`` gives ``len(gold) / len(answer)`` to any answer that
*contains* the gold one, so "1 2 3 4 5 6 7 8 9" earns 1/17 against "7"), and some pay 0.01 for any
answer at all. With ``partial_credit`` the task's score is used as is, clamped to [0, 1].
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import reasoning_gym
from reasoning_gym.utils import extract_answer

from workers.problem import Problem
from workers.reward.final_answer import last_boxed, without_echo
from workers.reward.results import CheckError

_FULL_MARKS = 1.0 - 1e-9  # a scorer's float arithmetic may land just below 1


def verify_reasoning_gym(completion: str, problem: Problem, *, partial_credit: bool = False) -> float:
    """1.0 if the task's own scorer gives the completion's answer full marks, else 0.0 (or, with
    ``partial_credit``, the task's score in [0, 1])."""
    dataset = problem.metadata.get("dataset")
    entry = problem.metadata.get("entry")
    if not isinstance(dataset, str) or not isinstance(entry, Mapping):
        raise CheckError(
            f"reasoning_gym problem {problem.id} needs metadata['dataset'] (a task name) "
            "and metadata['entry'] (a dict)"
        )
    answer = submitted_answer(without_echo(completion, problem.prompt))
    score = float(_score_answer_fn(dataset)(answer=answer, entry=dict(entry)))
    if math.isnan(score):
        raise CheckError(f"reasoning_gym task {dataset!r} returned NaN")
    if not partial_credit:
        return 1.0 if score >= _FULL_MARKS else 0.0
    return min(max(score, 0.0), 1.0)


def submitted_answer(completion: str) -> str | None:
    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else None


@functools.cache
def _score_answer_fn(dataset: str) -> Callable[..., float]:
    # get_score_answer_fn builds a dataset instance on every call: build it once per task and process.
    try:
        return reasoning_gym.get_score_answer_fn(dataset)
    except ValueError as error:
        raise CheckError(f"unknown reasoning_gym task {dataset!r}: {error}") from None
