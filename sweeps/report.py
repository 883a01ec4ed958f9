"""The ablation report of a sweep, from MLflow alone (no Ray): table, plots, parent-run artifacts.

    python -m sweeps.report SWEEP [--tracking-uri URI] [--metric accuracy] [--out-dir DIR] [--no-upload]

SWEEP is a sweep id (``gmts.sweep_id`` tag), a spec name (its newest sweep) or the parent run id.
The artifacts go to the parent run under ``ablation/``: ablation.csv (long, numeric), .md, .html,
.json (the numbers of ``ablation_results``) and the PNG plots.
"""

# ruff: noqa: E402  (the heavy imports follow the early --help on purpose)
from __future__ import annotations

import argparse
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sweeps.report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="sweep id, spec name (newest sweep) or parent run id")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or runs/mlflow.db)")
    parser.add_argument("--metric", default="accuracy", help="eval metric of the table: accuracy, pass@k, …")
    parser.add_argument("--out-dir", type=Path, help="keep the report files here (default: a temporary folder)")
    parser.add_argument("--no-upload", action="store_true", help="do not log the files on the parent run")
    return parser


# `--help` and usage errors answer here, before the imports below load MLflow, matplotlib and
# scipy (seconds each); main() parses again.
if __name__ == "__main__":
    _parser().parse_args()

import logging
import math
import os
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field

from mlflow import MlflowClient
from mlflow.entities import Metric, Run
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH
from pydantic import BaseModel, ValidationError, model_validator
from rich.console import Console

from orchestrator.data.worked_addition import ROLE_IDS
from sweeps import completions, plots
from sweeps.ablation import AblationResults, ablation
from sweeps.labels import arm_label
from sweeps.results import EVAL_METRIC, SweepNotFound, SweepRuns, find_parent, metric_history, read_sweep
from sweeps.statistics import t_interval
from sweeps.table_views import (LEGEND, WideTable, summary, to_csv, to_html, to_markdown, to_note, to_rich,
                               wide_tables)
from sweeps.parent_summary import compare_url, log_summary, run_url
from sweeps.parent_run import DESCRIPTION_TAG, default_tracking_uri
from workers.learner.methods import is_gmts_like

logger = logging.getLogger(__name__)

ARTIFACT_DIR = "ablation"
TABLE_ARTIFACT = "Ablation.html"  # the table again, at the root of the parent's artifacts
TOKEN_STATS_ARTIFACT = "diagnostics/token_stats.json"
# The training curve: for a 0/1 reward train/accuracy is the same number as reward/mean (no second panel).
CURVE_METRICS = ("reward/mean",)
DECISION_SHARE, DECISION_BASE_SHARE = "selection/decision_share", "selection/decision_base_share"
ROLE_SHARE_PREFIX = "selection/role_share/"


class AnswerTokens(BaseModel):
    entropy: list[float]  # H_t of each response token
    grad_norm: list[float]  # G_t = ‖e_o − p‖₂ of the same tokens
    # ω_t of the same tokens and the answer's group of rollouts (LearnerEngine.token_statistics); absent from
    # the artifacts of runs older than the GMTS-score check, which the report then skips with a note.
    omega: list[float] | None = None
    group: int | None = None
    advantage: float | None = None

    @model_validator(mode="after")
    def _same_length(self) -> AnswerTokens:
        if len(self.entropy) != len(self.grad_norm):
            raise ValueError(f"grad_norm: {len(self.grad_norm)} values for {len(self.entropy)} entropies")
        if self.omega is not None and len(self.omega) != len(self.entropy):
            raise ValueError(f"omega: {len(self.omega)} values for {len(self.entropy)} entropies")
        return self


class TokenStats(BaseModel):
    """``diagnostics/token_stats.json`` of a trial run (``orchestrator.train``): one diagnostic batch."""

    answers: list[AnswerTokens]
    step: int | None = None

    @property
    def has_omega(self) -> bool:
        return bool(self.answers) and all(a.omega is not None and a.group is not None for a in self.answers)


@dataclass
class Report:
    results: AblationResults
    tables: list[WideTable]
    folder: Path
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)  # the metrics logged on the parent run
    experiment_id: str = ""
    child_run_ids: list[str] = field(default_factory=list)  # the finished trials' runs
    completion_tables: list[completions.CompletionTable] = field(default_factory=list)  # one trial per arm


def ablation_results(tracking_uri: str, parent_run_id: str) -> dict:
    """The ablation cells of a sweep as JSON-able data (what ``GET /v1/sweeps/{id}/results`` serves)."""
    client = MlflowClient(tracking_uri)
    return ablation(read_sweep(client, client.get_run(parent_run_id))).model_dump(mode="json")


def build_report(client: MlflowClient, parent: Run, folder: Path, *, metric: str = "accuracy",
                 upload: bool = True) -> Report:
    """Write the table views and plots into ``folder`` and (``upload``) log them on the parent run."""
    runs = read_sweep(client, parent)
    results = ablation(runs)
    tables = wide_tables(results, metric)
    report = Report(results, tables, folder, experiment_id=runs.experiment_id,
                    child_run_ids=[t.run_id for t in runs.trials], completion_tables=completions.arm_tables(client, runs))
    shown = completions.to_markdown(report.completion_tables, client.tracking_uri, runs.experiment_id)
    if not report.completion_tables:
        report.notes.append("what the model says: no finished trial logged a completions table "
                            "(evaluation.shown_completions=0, or runs older than the tables)")
    folder.mkdir(parents=True, exist_ok=True)
    views = {
        "ablation.csv": to_csv(results),
        "ablation.md": to_markdown(results, tables, shown),
        "ablation.html": to_html(results, tables,
                                 completions.to_html(report.completion_tables, client.tracking_uri, runs.experiment_id)),
        "ablation.json": results.model_dump_json(indent=2),
    }
    for name, text in views.items():
        (folder / name).write_text(text)
        report.files.append(folder / name)
    diagnostic_numbers = _write_figures(client, runs, report, metric)
    for note in report.notes:
        logger.info("report: %s", note)
    if upload:
        _upload(client, parent, report, views["ablation.html"], shown, diagnostic_numbers, metric)
    return report


def _write_figures(client: MlflowClient, runs: SweepRuns, report: Report, metric: str) -> dict[str, float]:
    """The report's plots into its folder (a note for each that has nothing to show); returns the numbers of the
    token diagnostics, for the parent run."""
    results, folder = report.results, report.folder
    report.files += plots.accuracy_vs_ratio(results, folder, metric)
    report.files += plots.top_vs_bottom(results, folder, metric)  # none with a single mode
    lr_curve = plots.accuracy_vs_lr(results, folder / "accuracy_vs_lr.png", metric)
    if lr_curve is not None:
        report.files.append(lr_curve)
    if any(not c.selected and c.split == "test" for c in results.cells) and not any(
            c.split == "validation" for c in results.cells):
        report.notes.append("arms with several lrs but no validation benchmark: no lr chosen (the table would "
                            "otherwise pick on test); add an eval set with split: validation")
    evaluation = plots.eval_curves(eval_curves(client, runs, metric), folder / "eval_curves.png", metric)
    if evaluation is not None:
        report.files.append(evaluation)
    else:
        report.notes.append(f"evaluation curves: no finished trial logged eval/<benchmark>/{metric}")
    curves = plots.learning_curves(learning_curves(client, runs), folder / "learning_curves.png")
    if curves is not None:
        report.files.append(curves)
    else:
        report.notes.append(f"learning curves: no finished trial logged any of {list(CURVE_METRICS)}")
    routes = plots.where_tokens_go(token_routes(client, runs), folder / "where_tokens_go.png")
    if routes is not None:
        report.files.append(routes)
    else:
        report.notes.append(f"where the tokens go: no finished trial logged {DECISION_SHARE} (a task with token "
                            "roles, e.g. arithmetic style 'worked')")
    scatter, diagnostic_numbers = _token_scatter(client, runs, folder, report.notes)
    report.files += scatter
    return diagnostic_numbers


def _upload(client: MlflowClient, parent: Run, report: Report, table_html: str, shown: list[str],
            diagnostic_numbers: dict[str, float], metric: str) -> None:
    """The report's files, note, summary metrics and diagnostics onto the sweep's parent run."""
    run_id, results, tables = parent.info.run_id, report.results, report.tables
    if report.notes:
        (report.folder / "notes.txt").write_text("\n".join(report.notes) + "\n")
    # The table first: the run's root artifacts list in name order, capitals before the folders.
    with tempfile.TemporaryDirectory(prefix="gmts-report-") as tmp:
        table = Path(tmp) / TABLE_ARTIFACT
        table.write_text(table_html)
        client.log_artifact(run_id, str(table))
    client.log_artifacts(run_id, str(report.folder), artifact_path=ARTIFACT_DIR)
    note = to_note(results, tables, parent.data.tags.get(DESCRIPTION_TAG, ""), shown)
    if len(note) > MAX_TAG_VAL_LENGTH:  # MLflow would cut the description: keep its table whole
        note = to_note(results, tables, parent.data.tags.get(DESCRIPTION_TAG, ""),
                       [f"The completions tables of each arm: {ARTIFACT_DIR}/ablation.md"])
    report.summary = log_summary(client, run_id, results, note, metric=metric)
    if diagnostic_numbers:
        client.log_batch(run_id, metrics=[Metric(key, value, int(time.time() * 1000), 0)
                                          for key, value in sorted(diagnostic_numbers.items())])
        report.summary.update(diagnostic_numbers)


def learning_curves(client: MlflowClient, runs: SweepRuns) -> list[plots.Curve]:
    """Per grid point (seeds pooled) and metric: the mean value at each step over the seeds that logged it."""
    pooled: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for trial in runs.trials:
        p = trial.point
        for metric in CURVE_METRICS:
            for step, value in metric_history(client, trial.run_id, metric):
                pooled[(p.model_size, p.algorithm, p.method, p.mode, p.ratio, metric)][step].append(value)
    curves = []
    for (model_size, algorithm, method, mode, ratio, metric), by_step in pooled.items():
        steps = sorted(by_step)
        values = [sum(by_step[s]) / len(by_step[s]) for s in steps]
        curves.append(plots.Curve(model_size, algorithm, method, mode, ratio, metric, steps, values))
    return curves


def eval_curves(client: MlflowClient, runs: SweepRuns, metric: str = "accuracy") -> list[plots.EvalCurve]:
    """Per arm and test benchmark: the eval metric at each evaluated step, mean and 95 % t band over seeds."""
    pooled: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    several_lrs = len({t.point.lr for t in runs.trials}) > 1
    for trial in runs.trials:
        p = trial.point
        benchmarks = sorted({m["benchmark"] for key in trial.final if (m := EVAL_METRIC.match(key))
                             and m["metric"] == metric and m["benchmark"] not in trial.validation})
        for benchmark in benchmarks:
            arm = (p.model_size, p.algorithm, benchmark, p.method, p.mode, p.ratio, p.lr if several_lrs else None)
            for step, value in metric_history(client, trial.run_id, f"eval/{benchmark}/{metric}"):
                pooled[arm][step].append(value)
    curves = []
    for (model_size, algorithm, benchmark, method, mode, ratio, lr), by_step in pooled.items():
        steps = sorted(by_step)
        estimates = [t_interval(by_step[s]) for s in steps]
        curves.append(plots.EvalCurve(model_size, algorithm, benchmark, method, arm_label(method, mode, ratio, lr=lr),
                                      steps, [e.mean for e in estimates], [e.low for e in estimates],
                                      [e.high for e in estimates]))
    return curves


def token_routes(client: MlflowClient, runs: SweepRuns) -> list[plots.TokenRoute]:
    """Per arm (seeds pooled): the decision share of the selected tokens and its base rate at each step (mean
    over the seeds that logged it), and each role's share of the selected tokens at each seed's last step."""
    steps: dict[tuple, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    last: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    several_lrs = len({t.point.lr for t in runs.trials}) > 1
    for trial in runs.trials:
        p = trial.point
        shares = metric_history(client, trial.run_id, DECISION_SHARE)
        if not shares:
            continue
        arm = (p.model_size, p.algorithm, p.method, p.mode, p.ratio, p.lr if several_lrs else None)
        for key in (DECISION_SHARE, DECISION_BASE_SHARE):
            for step, value in shares if key == DECISION_SHARE else metric_history(client, trial.run_id, key):
                if math.isfinite(value):
                    steps[arm][key][step].append(value)
        # A run's metrics hold each key's value at its highest step.
        for key, value in client.get_run(trial.run_id).data.metrics.items():
            if key.startswith(ROLE_SHARE_PREFIX) and math.isfinite(value):
                last[arm][key.removeprefix(ROLE_SHARE_PREFIX)].append(value)
    mean = lambda values: sum(values) / len(values)
    routes = []
    for arm, by_key in steps.items():
        model_size, algorithm, method, mode, ratio, lr = arm
        shown = sorted(by_key[DECISION_SHARE])
        base = by_key[DECISION_BASE_SHARE]
        routes.append(plots.TokenRoute(
            model_size, algorithm, method, mode, arm_label(method, mode, ratio, lr=lr), shown,
            [mean(by_key[DECISION_SHARE][s]) for s in shown],
            [mean(base[s]) if base.get(s) else math.nan for s in shown],
            {role: mean(last[arm][role]) for role in sorted(last[arm], key=_role_order)}))
    return routes


def _role_order(role: str) -> tuple[int, str]:
    # The worked-addition grammar's order (operands, format, carries, digits, answer, off-grammar), others after.
    return ROLE_IDS.get(role, len(ROLE_IDS)), role


def _token_scatter(client: MlflowClient, runs: SweepRuns, folder: Path, notes: list[str]
                   ) -> tuple[list[Path], dict[str, float]]:
    """The paper's diagnostic figure from one trial's ``diagnostics/token_stats.json``, and its numbers
    (:data:`DIAGNOSTIC_METRICS`) for the parent run."""
    # Prefer a GMTS trial's batch (the paper's figure); any trial's batch shows the same relation.
    for trial in sorted(runs.trials, key=lambda t: not is_gmts_like(t.point.method)):
        listed = {a.path for a in client.list_artifacts(trial.run_id, TOKEN_STATS_ARTIFACT.rsplit("/", 1)[0])}
        if TOKEN_STATS_ARTIFACT not in listed:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            file = client.download_artifacts(trial.run_id, TOKEN_STATS_ARTIFACT, tmp)
            try:
                stats = TokenStats.model_validate_json(Path(file).read_text())
            except ValidationError as exc:
                notes.append(f"entropy-vs-G scatter: {trial.name}'s {TOKEN_STATS_ARTIFACT} is malformed: {exc}")
                continue
        numbers = token_diagnostics(stats)
        when = f"step {stats.step}" if stats.step is not None else "last training batch"
        path = plots.entropy_vs_gradnorm(
            [h for answer in stats.answers for h in answer.entropy],
            [g for answer in stats.answers for g in answer.grad_norm],
            numbers,
            folder / "entropy_vs_gradnorm.png",
            f"{trial.name} ({trial.point.method}), {when}",
        )
        described = ", ".join(f"{DIAGNOSTIC_METRICS[key]} = {value:.3f}" for key, value in numbers.items())
        notes.append(f"token diagnostics of {trial.name} ({len(stats.answers)} answers, {when}): {described}")
        if not stats.has_omega:
            notes.append(f"{trial.name}'s {TOKEN_STATS_ARTIFACT} predates the per-token ω and groups: no Spearman "
                         "of the GMTS score against the true gradient norm (rerun the trial to get it)")
        return [path], numbers
    notes.append(f"entropy-vs-G scatter skipped: no finished trial has {TOKEN_STATS_ARTIFACT}")
    return [], {}


# The parent run's metrics of the diagnostic batch, with what each one is.
DIAGNOSTIC_METRICS = {
    "diagnostics/spearman_entropy_gradnorm": "within-answer Spearman ρ(H, G)",
    "diagnostics/pearson_log_entropy_log_gradnorm": "within-answer Pearson r(log H, log G)",
    "diagnostics/spearman_gmts_score_true_gradnorm": "per-group Spearman ρ(H·|ω|, |ω|·G)",
}


def token_diagnostics(stats: TokenStats) -> dict[str, float]:
    """The core's correlations (workers.learner.diagnostics) of one diagnostic batch, NaN-free: a number
    that cannot be computed (too few tokens, no ω in an older artifact) is left out."""
    import torch  # only these numbers need it

    from workers.learner import diagnostics

    width = max((len(a.entropy) for a in stats.answers), default=0)
    rows = len(stats.answers)

    def padded(values_of) -> torch.Tensor:
        out = torch.zeros(rows, width, dtype=torch.float64)
        for i, answer in enumerate(stats.answers):
            values = values_of(answer)
            out[i, :len(values)] = torch.tensor(values, dtype=torch.float64)
        return out

    entropy, grad_norm = padded(lambda a: a.entropy), padded(lambda a: a.grad_norm)
    mask = torch.arange(width)[None] < torch.tensor([len(a.entropy) for a in stats.answers])[:, None]
    numbers = {
        "diagnostics/spearman_entropy_gradnorm": diagnostics.within_answer_spearman(entropy, grad_norm, mask),
        "diagnostics/pearson_log_entropy_log_gradnorm":
            diagnostics.log_entropy_gradnorm_pearson(entropy, grad_norm, mask),
    }
    if stats.has_omega:
        groups = torch.tensor([a.group for a in stats.answers])
        numbers["diagnostics/spearman_gmts_score_true_gradnorm"] = diagnostics.gmts_score_spearman(
            entropy, grad_norm, padded(lambda a: a.omega), mask, groups)
    return {key: value for key, value in numbers.items() if not math.isnan(value)}


def ui_command(tracking_uri: str) -> str:
    """How to look at the runs: the MLflow UI over a local store, or the server's own address."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri}"
    return f"mlflow ui --backend-store-uri {tracking_uri}"


def print_report(report: Report, tracking_uri: str, console: Console, metric: str = "accuracy") -> None:
    if report.tables:
        console.print(f"[bold]Ablation of sweep {report.results.sweep_id}[/]: {metric} (%), {LEGEND}", soft_wrap=True)
    for table in to_rich(report.results, report.tables):
        console.print(table)
    if report.tables:
        console.print(summary(report.results), soft_wrap=True)
    else:
        console.print("[yellow]No finished trial logged an eval metric: the table is empty.[/]")
    for note in report.notes:
        console.print(f"[dim]note: {note}[/]", soft_wrap=True)
    parent = report.results.parent_run_id
    console.print(f"Report: artifacts {TABLE_ARTIFACT} and '{ARTIFACT_DIR}/' of parent run {parent}", soft_wrap=True)
    console.print(f"MLflow UI: {ui_command(tracking_uri)}", soft_wrap=True, highlight=False)
    if report.experiment_id:
        console.print(f"  the answer (parent run):  {run_url(tracking_uri, report.experiment_id, parent)}",
                      soft_wrap=True, highlight=False)
    if report.child_run_ids:
        console.print(f"  compare the trials:       "
                      f"{compare_url(tracking_uri, report.experiment_id, report.child_run_ids)}",
                      soft_wrap=True, highlight=False)
    for table in report.completion_tables:
        console.print(f"  what {table.arm} says ({table.eval_set}, step {table.step}, {table.trial}): "
                      f"{table.url(tracking_uri, report.experiment_id)}", soft_wrap=True, highlight=False)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    tracking_uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(Path("runs"))
    client = MlflowClient(tracking_uri)
    console = Console()
    try:
        parent = find_parent(client, args.sweep)
    except SweepNotFound as exc:
        console.print(f"[red]{exc}[/] (tracking URI {tracking_uri})")
        return 2
    with tempfile.TemporaryDirectory(prefix="gmts-report-") as tmp:
        report = build_report(client, parent, args.out_dir or Path(tmp), metric=args.metric, upload=not args.no_upload)
        print_report(report, tracking_uri, console, args.metric)
        if args.out_dir:
            console.print(f"Report files: {args.out_dir}")
    if args.metric not in report.results.metrics and report.results.metrics:
        console.print(f"[yellow]metric {args.metric!r} not found; the sweep has {report.results.metrics}[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
