"""Read a sweep back from MLflow alone: its parent run, its trials' grid points and final metrics.

A trial's grid point comes from the short params ``orchestrator.train`` logs on every run
(``method, scope, denominator, ratio, mode, model_size, algorithm, seed``), falling back to the flattened
config keys, plus the learner's lr. ``method`` is a reference recipe's name when the trial ran one. Its
step-0 ``base/…`` metrics give the table's base row; eval sets on a validation split
(``data.eval.<name>.split``) are marked, so the report chooses lrs on them and never shows them as test.
The full-token baseline (``method=none``) has no ratio and no mode, whatever its config says.
"""

from __future__ import annotations

import logging
import re

from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from pydantic import BaseModel, ConfigDict

from sweeps.parent_run import LR_SOURCE_TAG, PARENT_TAG, SPEC_NAME_TAG, SWEEP_ID_TAG, TRIAL_TAG
from workers.learner.methods import full_token_method, keeps_every_token

logger = logging.getLogger(__name__)

# Grid param → the flattened-config keys that hold the same value, in order of preference.
PARAM_SOURCES: dict[str, tuple[str, ...]] = {
    "method": ("method", "selection.method"),
    "ratio": ("ratio", "selection.ratio"),
    "mode": ("mode", "selection.mode"),
    "scope": ("scope", "selection.scope"),
    "denominator": ("denominator",),
    "model_size": ("model_size", "model.size"),
    "algorithm": ("algorithm", "algorithm.name"),
    "seed": ("seed", "training.seed"),
    "lr": ("learner.lr",),
}
EVAL_METRIC = re.compile(r"^eval/(?P<benchmark>[^/]+)/(?P<metric>[^/]+)$")
# The step-0 evaluation of the base policy, logged again under its own name by orchestrator.train.
BASE_METRIC = re.compile(r"^base/(?P<benchmark>[^/]+)/(?P<metric>[^/]+)$")
EVAL_SPLIT_PARAM = re.compile(r"^data\.eval\.(?P<benchmark>[^.]+)\.split$")
RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class SweepNotFound(LookupError):
    """No parent run matches the given sweep id, spec name or run id."""


class TrialPoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    method: str
    ratio: float | None = None
    mode: str | None = None
    scope: str | None = None  # the ranking population (None for the baseline)
    denominator: str | None = None  # 'all' or 'selected': what the policy-gradient term is normalised by
    model_size: str = "-"
    algorithm: str = "-"
    seed: int | None = None
    lr: float | None = None  # learner.lr: arms can each have their own list (sweeps.spec)


class TrialRecord(BaseModel):
    run_id: str
    name: str  # the trial (tag gmts.trial) or, failing that, the run name
    status: str
    point: TrialPoint
    final: dict[str, float]  # eval/<benchmark>/<metric> → the last logged value
    base: dict[str, float] = {}  # base/<benchmark>/<metric> → the base policy's (step-0) value
    validation: list[str] = []  # benchmarks evaluated on a validation split (choose lrs, never reported as test)
    base_checksum: str | None = None


class SweepRuns(BaseModel):
    parent_run_id: str
    experiment_id: str
    sweep_id: str
    spec_name: str
    lr_source: str = ""  # the spec's lr_source: where its fixed lrs come from
    trials: list[TrialRecord]  # finished trials, one per trial (duplicates resolved)
    unfinished: list[TrialRecord]  # trials whose newest run did not finish (failed, killed, running)


def find_parent(client: MlflowClient, sweep: str) -> Run:
    """The parent run of ``sweep``: a run id, a sweep id (tag gmts.sweep_id) or a spec name (newest)."""
    if RUN_ID.match(sweep):
        try:
            return client.get_run(sweep)
        except MlflowException:
            pass
    experiment_ids = [e.experiment_id for e in client.search_experiments()]
    for tag in (SWEEP_ID_TAG, SPEC_NAME_TAG):
        runs = client.search_runs(
            experiment_ids, filter_string=f"tags.`{tag}` = '{sweep}'", order_by=["attributes.start_time DESC"]
        )
        parents = [run for run in runs if PARENT_TAG not in run.data.tags]
        if parents:
            return parents[0]
    raise SweepNotFound(f"sweep {sweep!r}: no parent run with that run id, {SWEEP_ID_TAG} or {SPEC_NAME_TAG} tag")


def read_sweep(client: MlflowClient, parent: Run) -> SweepRuns:
    experiment_id = parent.info.experiment_id
    children = _search_all(client, experiment_id, f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    newest: dict[str, Run] = {}
    # A trial restarted before its first checkpoint opens a second run; keep its finished one, else its newest.
    for run in sorted(children, key=lambda r: (r.info.status == "FINISHED", r.info.start_time)):
        newest[_trial_name(run)] = run
    records = [_record(run) for run in newest.values()]
    records.sort(key=lambda r: r.name)
    return SweepRuns(
        parent_run_id=parent.info.run_id,
        experiment_id=experiment_id,
        sweep_id=parent.data.tags.get(SWEEP_ID_TAG, parent.info.run_name or parent.info.run_id),
        spec_name=parent.data.tags.get(SPEC_NAME_TAG, parent.data.params.get("spec_name", "")),
        lr_source=parent.data.tags.get(LR_SOURCE_TAG, ""),
        trials=[r for r in records if r.status == "FINISHED"],
        unfinished=[r for r in records if r.status != "FINISHED"],
    )


def metric_history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _search_all(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _trial_name(run: Run) -> str:
    return run.data.tags.get(TRIAL_TAG) or run.info.run_name or run.info.run_id


def _record(run: Run) -> TrialRecord:
    final = {key: value for key, value in run.data.metrics.items() if EVAL_METRIC.match(key)}
    base = {key: value for key, value in run.data.metrics.items() if BASE_METRIC.match(key)}
    validation = sorted(match["benchmark"] for key, value in run.data.params.items()
                        if (match := EVAL_SPLIT_PARAM.match(key)) and value == "validation")
    return TrialRecord(
        run_id=run.info.run_id, name=_trial_name(run), status=run.info.status, point=_point(run.data.params),
        final=final, base=base, validation=validation, base_checksum=run.data.tags.get("base/checksum"),
    )


def _point(params: dict[str, str]) -> TrialPoint:
    raw = {axis: next((params[k] for k in keys if k in params), None) for axis, keys in PARAM_SOURCES.items()}
    method = raw["method"] or full_token_method()  # a run that names no method ran the config's default
    baseline = keeps_every_token(method)
    return TrialPoint(
        method=method,
        ratio=None if baseline or _is_null(raw["ratio"]) else float(raw["ratio"]),
        mode=None if baseline or _is_null(raw["mode"]) else raw["mode"],
        scope=None if baseline or _is_null(raw["scope"]) else raw["scope"],
        denominator=None if baseline or _is_null(raw["denominator"]) else raw["denominator"],
        model_size=raw["model_size"] if not _is_null(raw["model_size"]) else "-",
        algorithm=raw["algorithm"] if not _is_null(raw["algorithm"]) else "-",
        seed=None if _is_null(raw["seed"]) else int(raw["seed"]),
        lr=None if _is_null(raw["lr"]) else float(raw["lr"]),
    )


def _is_null(value: str | None) -> bool:
    return value is None or value.strip() in ("", "None", "null")
