"""reasoning-gym domain: each procedural task scores answers with its own ``score_answer``.

``problem.metadata["dataset"]`` names the task and ``metadata["entry"]`` is the generated entry (a
dict with ``question``, ``answer``, ``metadata``). The answer handed to the scorer is, in order:
the last ``<answer>…</answer>`` (reasoning-gym's own prompt format), the last ``\\boxed{…}``, the
last non-empty line. Scorers may give partial credit; the result is clamped to [0, 1].
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import reasoning_gym
from reasoning_gym.utils import extract_answer

from workers.problem import Problem
from workers.reward.final_answer import last_boxed
from workers.reward.results import CheckError


def verify_reasoning_gym(completion: str, problem: Problem) -> float:
    """The task's own score of the completion's answer, in [0, 1]."""
    dataset = problem.metadata.get("dataset")
    entry = problem.metadata.get("entry")
    if not isinstance(dataset, str) or not isinstance(entry, Mapping):
        raise CheckError(
            f"reasoning_gym problem {problem.id} needs metadata['dataset'] (a task name) "
            "and metadata['entry'] (a dict)"
        )
    score = _score_answer_fn(dataset)(answer=submitted_answer(completion), entry=dict(entry))
    score = float(score)
    if math.isnan(score):
        raise CheckError(f"reasoning_gym task {dataset!r} returned NaN")
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
