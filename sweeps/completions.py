"""Where to see what each arm's model says: the last completions table of one trial per arm, as MLflow UI links.

A gain in the ablation table is one click from the answers behind it: per arm, the trial with the lowest seed
(the same choice in every report), and per eval set the newest ``completions/<set>/step_NNNNNN.json`` of its run
(``orchestrator.completion_table``: the same problems at every evaluation, the step-0 table the base's).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from mlflow import MlflowClient

from orchestrator.completion_table import FOLDER
from sweeps.labels import arm_label
from sweeps.parent_summary import artifact_url
from sweeps.results import SweepRuns, TrialRecord

# Axes named in an arm's label only when the sweep varies them (the method, mode and ratio always are).
_OPTIONAL_AXES = ("scope", "denominator", "lr", "model_size", "algorithm")


@dataclass(frozen=True)
class CompletionTable:
    arm: str  # "GMTS-release top-20 %"
    trial: str  # the trial shown for the arm
    seed: int | None
    run_id: str
    eval_set: str
    step: int
    path: str  # the run's artifact, completions/<set>/step_NNNNNN.json

    def url(self, tracking_uri: str, experiment_id: str) -> str:
        return artifact_url(tracking_uri, experiment_id, self.run_id, self.path)


def last_tables(client: MlflowClient, run_id: str) -> dict[str, str]:
    """Eval set → the path of the run's newest completions table (file names sort by step)."""
    newest = {}
    for folder in client.list_artifacts(run_id, FOLDER):
        if folder.is_dir:
            files = sorted(f.path for f in client.list_artifacts(run_id, folder.path) if f.path.endswith(".json"))
            if files:
                newest[folder.path.rsplit("/", 1)[-1]] = files[-1]
    return newest


def arm_tables(client: MlflowClient, runs: SweepRuns) -> list[CompletionTable]:
    """Per arm (in the trials' name order) and eval set, the last completions table of its lowest-seed trial."""
    varying = [axis for axis in _OPTIONAL_AXES if len({getattr(t.point, axis) for t in runs.trials}) > 1]
    shown: dict[str, TrialRecord] = {}
    for trial in sorted(runs.trials, key=lambda t: (t.point.seed is None, t.point.seed or 0, t.name)):
        shown.setdefault(_arm(trial, varying), trial)
    tables = []
    for arm, trial in sorted(shown.items(), key=lambda item: item[1].name):
        for eval_set, path in sorted(last_tables(client, trial.run_id).items()):
            step = int(path.rsplit("step_", 1)[-1].removesuffix(".json"))
            tables.append(CompletionTable(arm, trial.name, trial.point.seed, trial.run_id, eval_set, step, path))
    return tables


def _arm(trial: TrialRecord, varying: list[str]) -> str:
    p = trial.point
    return arm_label(p.method, p.mode, p.ratio, **{axis: getattr(p, axis) for axis in varying})


def _caption(table: CompletionTable) -> str:
    seed = "" if table.seed is None else f", seed {table.seed}"
    return f"{table.eval_set} at step {table.step} ({table.trial}{seed})"


def to_markdown(tables: list[CompletionTable], tracking_uri: str, experiment_id: str) -> list[str]:
    """A "What the model says" section: one line per arm, a link per eval set."""
    if not tables:
        return []
    lines = ["**What the model says** (the last completions table of one trial per arm):", ""]
    for arm in dict.fromkeys(t.arm for t in tables):
        links = ", ".join(f"[{_caption(t)}]({t.url(tracking_uri, experiment_id)})" for t in tables if t.arm == arm)
        lines.append(f"- {arm}: {links}")
    return lines


def to_html(tables: list[CompletionTable], tracking_uri: str, experiment_id: str) -> str:
    if not tables:
        return ""
    e = html.escape
    items = []
    for arm in dict.fromkeys(t.arm for t in tables):
        links = ", ".join(f"<a href='{e(t.url(tracking_uri, experiment_id))}'>{e(_caption(t))}</a>"
                          for t in tables if t.arm == arm)
        items.append(f"<li>{e(arm)}: {links}</li>")
    return ("<h2>What the model says</h2><p>The last completions table of one trial per arm (prompt, completion, "
            "the answer the verifier read, reference, reward):</p><ul>" + "".join(items) + "</ul>")
