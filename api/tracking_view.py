"""What the control plane reads from and writes to MLflow: find a submission's run, count its trials,
mark runs KILLED on cancel, and fetch the ablation table.

How a submission's MLflow run is found (most to least exact):
0. a sweep the service launched runs under its API id (``sweeps.run --sweep-id sw-…``): its parent run
   carries ``gmts.sweep_id=<id>`` from the moment it opens;
1. the service sets the config tag ``gmts_api_id=<id>`` (``tracking.tags``) on every run it launches,
   so a single run carries it and so does every child run of a sweep; a sweep's parent is then the
   ``mlflow.parentRunId`` of any child (or a run with the tag and no parent, if ``sweeps.run`` tags its
   parent from ``$GMTS_API_ID`` too);
2. before any child exists, a sweep's parent is the earliest parent run tagged ``gmts.spec=<spec name>``
   (set by ``sweeps.run``) started after the submission — a guess, so it is not stored.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from mlflow.tracking import MlflowClient

from api.store import Submission
from sweeps.parent_run import PARENT_TAG, SPEC_NAME_TAG, SWEEP_ID_TAG, TRIAL_TAG

logger = logging.getLogger(__name__)

# No dot in the name: sweep overrides are flattened into dotted keys, which would split "gmts.api_id".
API_ID_TAG = "gmts_api_id"
UNFINISHED_RUN_STATES = ("RUNNING", "SCHEDULED")
# A parent run starts after its job was accepted; allow for clock skew between hosts.
PARENT_START_SLACK_MS = 60_000


@dataclass
class TrialCounts:
    total: int
    running: int = 0
    finished: int = 0
    failed: int = 0
    killed: int = 0


@dataclass
class RunLocation:
    run_id: str
    experiment_id: str
    exact: bool  # found through the api-id tag (safe to store), not through the name/time guess
    trials: list[Any] = field(default_factory=list)  # a sweep's child runs; a single run is its own trial


class TrackingView:
    def __init__(self, tracking_uri: str, ui_url: str | None) -> None:
        # MLflow's HTTP client retries for minutes by default; a status page must not hang that long.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.uri = tracking_uri
        self.ui_url = ui_url
        self.client = MlflowClient(tracking_uri)

    def ping(self) -> str:
        self.client.search_experiments(max_results=1)
        return "ok"

    def locate(self, record: Submission) -> RunLocation | None:
        experiment = self.client.get_experiment_by_name(record.experiment)
        if experiment is None:
            return None
        exp = experiment.experiment_id
        if record.mlflow_run_id:
            location = RunLocation(record.mlflow_run_id, exp, exact=True)
        else:
            location = self._by_api_id(record, exp) or self._by_spec_name(record, exp)
        if location is None:
            return None
        if record.kind == "sweep":
            location.trials = self.client.search_runs(
                [exp], f"tags.`{PARENT_TAG}` = '{location.run_id}'", max_results=10_000
            )
        else:
            location.trials = [self.client.get_run(location.run_id)]
        return location

    def _by_api_id(self, record: Submission, exp: str) -> RunLocation | None:
        if record.kind == "sweep":
            parents = self.client.search_runs([exp], f"tags.`{SWEEP_ID_TAG}` = '{record.id}'", max_results=10)
            for run in parents:
                if PARENT_TAG not in run.data.tags:
                    return RunLocation(run.info.run_id, exp, exact=True)
        runs = self.client.search_runs([exp], f"tags.`{API_ID_TAG}` = '{record.id}'", max_results=1000)
        for run in runs:
            if PARENT_TAG not in run.data.tags:
                return RunLocation(run.info.run_id, exp, exact=True)
        if record.kind == "sweep" and runs:
            return RunLocation(runs[0].data.tags[PARENT_TAG], exp, exact=True)
        return None

    def _by_spec_name(self, record: Submission, exp: str) -> RunLocation | None:
        if record.kind != "sweep":
            return None
        since = int(record.created_at * 1000) - PARENT_START_SLACK_MS
        runs = self.client.search_runs(
            [exp],
            f"tags.`{SPEC_NAME_TAG}` = '{record.name}' and attributes.start_time >= {since}",
            order_by=["attributes.start_time ASC"],
            max_results=10,
        )
        runs = [run for run in runs if PARENT_TAG not in run.data.tags]
        return RunLocation(runs[0].info.run_id, exp, exact=False) if runs else None

    def trial_counts(self, location: RunLocation | None, total: int) -> TrialCounts:
        counts = TrialCounts(total=total)
        for run in _one_run_per_trial(location.trials if location else []):
            status = run.info.status
            if status in UNFINISHED_RUN_STATES:
                counts.running += 1
            elif status == "FINISHED":
                counts.finished += 1
            elif status == "FAILED":
                counts.failed += 1
            elif status == "KILLED":
                counts.killed += 1
        return counts

    def close_runs(self, location: RunLocation, trial_status: str, parent_status: str | None,
                   force_parent: bool = False) -> int:
        """After the job ended: no run of it can still be running. Unfinished trial runs get
        ``trial_status`` (finished ones keep theirs); the parent gets ``parent_status`` if it is still
        open — or whatever it says when ``force_parent`` (a cancelled sweep is KILLED even if its driver
        marked it FAILED on the way down). Returns how many runs changed."""
        closed = 0
        for run in location.trials:
            if run.info.run_id != location.run_id and run.info.status in UNFINISHED_RUN_STATES:
                self.client.set_terminated(run.info.run_id, status=trial_status)
                closed += 1
        if parent_status is not None:
            parent = self.client.get_run(location.run_id).info.status
            if parent != parent_status and (force_parent or parent in UNFINISHED_RUN_STATES):
                self.client.set_terminated(location.run_id, status=parent_status)
                closed += 1
        return closed

    def run_link(self, location: RunLocation) -> str | None:
        if not self.ui_url:
            return None
        return f"{self.ui_url}/#/experiments/{location.experiment_id}/runs/{location.run_id}"

    def ablation_results(self, parent_run_id: str) -> dict[str, Any]:
        from sweeps.report import ablation_results  # written with the sweeps issue; imported when asked

        return ablation_results(self.uri, parent_run_id)


def _one_run_per_trial(runs: list[Any]) -> list[Any]:
    """A trial restarted by Tune may leave the run of an earlier attempt behind: count each trial once,
    by its finished run, else its newest (the rule of sweeps.results.read_sweep)."""
    chosen: dict[str, Any] = {}
    for run in sorted(runs, key=lambda r: (r.info.status == "FINISHED", r.info.start_time or 0)):
        chosen[run.data.tags.get(TRIAL_TAG, run.info.run_id)] = run
    return list(chosen.values())
