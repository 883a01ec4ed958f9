"""reasoning-gym domain: each procedural task scores answers with its ``score_answer``, or our own transcription.

``problem.metadata["dataset"]`` names the task and ``metadata["entry"]`` is the generated entry (a
dict with ``question``, ``answer``, ``metadata``). The answer handed to the scorer is, in order:
the last ``<answer>…</answer>`` (reasoning-gym's own prompt format), the last ``\\boxed{…}``, the
last non-empty line (after removing an echo of the question).

Which scorer: tasks whose own scorer evaluates text as Python (``eval``, sympy's ``parse_expr``) are scored
by our transcription (``reasoning_gym_safe_scorers.SAFE_SCORERS``), which builds values without running
code; the tasks in ``REFUSED_TASKS`` are not scored at all (their checks error); every other task by its
own ``score_answer``. Whichever it is runs in a throwaway, locked-down child forked for this one check
(``scoring_jail``): nothing the answer makes the scorer do can outlive the check or reach the verifier
process, and a scorer that tries to execute the answer text makes the check a ``CheckError``.

Only a full score counts unless ``partial_credit`` is on: many tasks' scorers pay for listing
candidates (the default ``score_answer`` gives ``len(gold) / len(answer)`` to any answer that
*contains* the gold one, so "1 2 3 4 5 6 7 8 9" earns 1/17 against "7"), and some pay 0.01 for any
answer at all. With ``partial_credit`` the task's score is used as is, clamped to [0, 1].
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import reasoning_gym
from reasoning_gym.utils import extract_answer

from workers.problem import Problem
from workers.reward.final_answer import last_boxed, without_echo
from workers.reward.reasoning_gym_safe_scorers import REFUSED_TASKS, SAFE_SCORERS
from workers.reward.results import CheckError
from workers.reward.scoring_jail import score_in_child

_FULL_MARKS = 1.0 - 1e-9  # a scorer's float arithmetic may land just below 1
DEFAULT_CPU_SECONDS = 10


def verify_reasoning_gym(completion: str, problem: Problem, *, partial_credit: bool = False,
                         cpu_seconds: int = DEFAULT_CPU_SECONDS) -> float:
    """1.0 if the task's scorer gives the completion's answer full marks, else 0.0 (or, with
    ``partial_credit``, the task's score in [0, 1]). The scorer runs in a locked-down child with at most
    ``cpu_seconds`` of CPU time."""
    dataset = problem.metadata.get("dataset")
    entry = problem.metadata.get("entry")
    if not isinstance(dataset, str) or not isinstance(entry, Mapping):
        raise CheckError(
            f"reasoning_gym problem {problem.id} needs metadata['dataset'] (a task name) "
            "and metadata['entry'] (a dict)"
        )
    if dataset in REFUSED_TASKS:
        raise CheckError(f"reasoning_gym task {dataset!r} is refused: {REFUSED_TASKS[dataset]}")
    answer = submitted_answer(without_echo(completion, problem.prompt))
    entry = dict(entry)
    scorer = _score_answer_fn(dataset)
    _warm_up(dataset, entry)
    score = score_in_child(lambda: scorer(answer=answer, entry=entry), task=dataset, cpu_seconds=cpu_seconds)
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
        own = reasoning_gym.get_score_answer_fn(dataset)
    except ValueError as error:
        raise CheckError(f"unknown reasoning_gym task {dataset!r}: {error}") from None
    if dataset in SAFE_SCORERS:
        # Our transcription needs the task's configuration (puzzle24's number range): its dataset instance.
        return functools.partial(SAFE_SCORERS[dataset], getattr(own, "__self__", None))
    return own


_warmed: set[str] = set()


def _warm_up(dataset: str, entry: dict) -> None:
    """Run the scorer once per task and process in the verifier process, on the entry's own gold answer and
    on "0" (trusted text, never the completion's): the lazy imports and caches the forked children need are
    then loaded before their lockdown, and each check inherits them instead of redoing them."""
    if dataset in _warmed:
        return
    _warmed.add(dataset)
    scorer = _score_answer_fn(dataset)
    for trusted in (entry.get("answer"), "0"):
        try:
            scorer(answer=trusted if isinstance(trusted, str) else None, entry=entry)
        except Exception:  # noqa: BLE001 - a failing warm-up only costs speed; the check reports its own error
            pass
