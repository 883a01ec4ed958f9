"""What the model says: at every evaluation, a table of the first ``evaluation.shown_completions`` problems of
each eval set with the policy's completion, the final answer the verifier read from it, the reference and the
reward.

The same problems at every evaluation (the first ones of the held-out set, by index; the base's step 0
included), so a reader follows one question from the base to the trained policy. With k samples per problem
the first sample is shown. One MLflow artifact per set and evaluation, ``completions/<set>/step_NNNNNN.json``,
which the MLflow UI's artifact view shows as a table; the step-0 tables stay listed for that view however
many evaluations follow (``orchestrator.run_tracking.log_table``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.problem import Problem
from workers.reward.shown_answer import shown_answer

if TYPE_CHECKING:  # the sweep report reads this module's names without torch, which evaluation imports
    from orchestrator.evaluation import Evaluation
    from orchestrator.run_tracking import RunTracker

# What a reader compares first comes first: the UI's table view shows about four columns before it scrolls,
# and answer, reference and reward tell at a glance whether a gain is real.
COLUMNS = ("answer", "reference", "reward", "completion", "prompt", "problem_id", "index", "step", "set")
FOLDER = "completions"


def artifact_file(eval_set: str, step: int) -> str:
    """``completions/<set>/step_NNNNNN.json``: zero-padded, so a folder's files sort by step."""
    return f"{FOLDER}/{eval_set}/step_{step:06d}.json"


def completion_rows(step: int, eval_set: str, problems: list[Problem], completions: list[str],
                    rewards: list[float], shown: int) -> list[list]:
    """One row per shown problem (``COLUMNS``): the first ``shown`` of ``problems``, whose completions and
    rewards are the first entries of ``completions`` and ``rewards`` (one per problem, in problem order)."""
    count = min(shown, len(problems))
    if len(completions) < count or len(rewards) < count:
        raise ValueError(f"{eval_set}: {len(completions)} completions and {len(rewards)} rewards for the "
                         f"first {count} problems")
    shown_rows = zip(problems[:count], completions, rewards)
    return [[shown_answer(completion, problem), problem.answer, float(reward), completion, problem.prompt,
             problem.id, index, step, eval_set]
            for index, (problem, completion, reward) in enumerate(shown_rows)]


def log_completion_tables(tracker: RunTracker, step: int, eval_sets: dict[str, list[Problem]],
                          evaluation: Evaluation, shown: int) -> None:
    """Log the table of each eval set on ``tracker``'s run (held by the process that owns the run)."""
    if shown <= 0:
        return
    for name, problems in eval_sets.items():
        if name in evaluation.answers:
            rows = completion_rows(step, name, problems, evaluation.answers[name], evaluation.rewards[name],
                                   shown)
            tracker.log_table(artifact_file(name, step), COLUMNS, rows, pinned=step == 0)
