"""The completions table of an evaluation (orchestrator/completion_table.py), logged on a real MLflow run.

Real MLflow (a SQLite store in a temporary folder) and the shipped preset's arithmetic eval set; the
completions stand in for a policy's (no engine: the table only reads what evaluate() returned)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

from orchestrator.completion_table import COLUMNS, artifact_file, completion_rows, log_completion_tables
from orchestrator.config_loader import load_experiment
from orchestrator.data import load_dataset
from orchestrator.evaluation import Evaluation
from orchestrator.run_tracking import RunTracker, table_listing


@pytest.fixture
def eval_sets(tmp_path: Path):
    config = load_experiment("cpu-tiny-s", [f"output_dir={tmp_path}", f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db",
                                            "evaluation.shown_completions=4"])
    return config, {name: load_dataset(spec) for name, spec in config.data.eval.items()}


def _answered(problems, right: set[int]) -> tuple[list[str], list[float]]:
    """A completion per problem: the reference (then junk the verifier ignores) for ``right``, else a wrong one."""
    completions = [f"{p.answer}<eos>x" if i in right else f"{int(p.answer) + 1}" for i, p in enumerate(problems)]
    return completions, [1.0 if i in right else 0.0 for i in range(len(problems))]


def test_rows_hold_the_first_problems_with_answer_reference_and_reward(eval_sets) -> None:
    _, sets = eval_sets
    problems = sets["arithmetic"]
    completions, rewards = _answered(problems, right={1})
    rows = completion_rows(7, "arithmetic", problems, completions, rewards, shown=3)
    assert [dict(zip(COLUMNS, row))["index"] for row in rows] == [0, 1, 2]
    second = dict(zip(COLUMNS, rows[1]))
    assert second == {"step": 7, "set": "arithmetic", "index": 1, "problem_id": problems[1].id,
                      "prompt": problems[1].prompt, "completion": completions[1], "answer": problems[1].answer,
                      "reference": problems[1].answer, "reward": 1.0}
    assert dict(zip(COLUMNS, rows[0]))["answer"] == str(int(problems[0].answer) + 1)
    assert len(completion_rows(0, "arithmetic", problems[:2], completions, rewards, shown=16)) == 2  # a small set
    with pytest.raises(ValueError, match="completions"):
        completion_rows(0, "arithmetic", problems, completions[:2], rewards, shown=3)


@pytest.mark.slow
def test_every_evaluation_logs_a_table_the_ui_lists_and_a_resumed_one_overwrites(eval_sets) -> None:
    config, sets = eval_sets
    tracker = RunTracker(config)
    for step, right in ((0, {0}), (2, {0, 1, 2}), (2, {0, 1, 2})):  # step 2 twice: a resumed run repeats it
        answers, rewards = {}, {}
        for name, problems in sets.items():
            answers[name], rewards[name] = _answered(problems, right)
        log_completion_tables(tracker, step, sets, Evaluation({}, answers, rewards), config.evaluation.shown_completions)
    tracker.finish()
    client = MlflowClient(config.tracking_uri())
    listed = json.loads(client.get_run(tracker.run_id).data.tags[MLFLOW_LOGGED_ARTIFACTS])
    assert [e["path"] for e in listed] == [artifact_file(n, s) for s in (0, 2) for n in sets]
    assert artifact_file("arithmetic", 2) == "completions/arithmetic/step_000002.json"
    # The file reads as MLflow reads its own tables (pandas' split orient); the repeat did not append.
    with tempfile.TemporaryDirectory() as tmp:
        table = pd.read_json(client.download_artifacts(tracker.run_id, artifact_file("arithmetic", 2), tmp),
                             orient="split")
    assert list(table.columns) == list(COLUMNS)
    assert table["index"].tolist() == [0, 1, 2, 3] and table["reward"].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert table["problem_id"].tolist() == [p.id for p in sets["arithmetic"][:4]]


@pytest.mark.slow
def test_zero_shown_completions_logs_nothing(eval_sets) -> None:
    config, sets = eval_sets
    tracker = RunTracker(config)
    log_completion_tables(tracker, 0, sets, Evaluation({}, {}, {}), 0)
    assert MlflowClient(config.tracking_uri()).list_artifacts(tracker.run_id, "completions") == []
    tracker.finish()


def test_the_listing_keeps_pinned_tables_and_fits_mlflows_tag_length() -> None:
    listed = table_listing([], "completions/a/step_000000.json", pinned=True)
    for step in range(1, 60):
        listed = table_listing(listed, f"completions/a/step_{step:06d}.json", limit=1000)
    assert len(json.dumps(listed)) <= 1000
    assert listed[0] == {"path": "completions/a/step_000000.json", "type": "table", "pinned": True}
    assert listed[-1]["path"] == "completions/a/step_000059.json"
    assert table_listing(listed, listed[-1]["path"]) is listed  # already listed: unchanged
