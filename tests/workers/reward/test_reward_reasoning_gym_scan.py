"""Which registered reasoning-gym tasks' own scorers execute text: every one is run on its gold answer and on
wrong answers inside the scoring jail, whose audit hook refuses (and reports) code execution. Each task found
must be scored by our transcription or refused; a new reasoning-gym release that adds one fails here."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest
import reasoning_gym
from reasoning_gym.factory import DATASETS

from workers.reward.reasoning_gym_safe_scorers import REFUSED_TASKS, SAFE_SCORERS
from workers.reward.results import CheckError
from workers.reward.scoring_jail import score_in_child

WRONG_ANSWERS = ["0", "[[1, 2], [3]]", "x + 1", "abc"]
# Tasks that cannot be generated on their own (composite needs a list of datasets; it is refused).
NOT_GENERATED = {"composite"}


def _scan(tasks: list[str]) -> tuple[set[str], int]:
    """The tasks among ``tasks`` whose own scorer executed answer text, and how many were generated."""
    executing, generated = set(), 0
    for task in tasks:
        # One entry per task: its gold and the wrong answers of every shape reach each parse path of a scorer.
        entries = list(reasoning_gym.create_dataset(task, size=1, seed=1))
        generated += 1
        own = reasoning_gym.get_score_answer_fn(task)
        for entry in entries:
            for answer in [str(entry["answer"]), *WRONG_ANSWERS]:
                try:
                    score_in_child(lambda: own(answer=answer, entry=entry), task=task, cpu_seconds=20)
                except CheckError as error:
                    if "execute the answer text" in str(error):
                        executing.add(task)
    return executing, generated


@pytest.mark.slow
def test_every_task_that_executes_text_has_a_safe_scorer_or_is_refused():
    tasks = [task for task in sorted(DATASETS) if task not in NOT_GENERATED]
    # Half the tasks in each of two fresh interpreters (spawn: each forks its scoring jails from one thread): the
    # generation and the scorers are single-threaded Python, a minute of one core for the whole registry.
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        scans = list(pool.map(_scan, [tasks[0::2], tasks[1::2]]))
    executing = scans[0][0] | scans[1][0]
    generated = scans[0][1] + scans[1][1]
    assert generated >= 90
    assert executing == set(SAFE_SCORERS)
    assert set(REFUSED_TASKS) <= NOT_GENERATED | set(SAFE_SCORERS) | executing
