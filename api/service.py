"""The control plane's behaviour, free of HTTP: submit, reconcile with Ray, cancel, report.

Status is Ray's, progress is MLflow's, and both reach a reader through SQLite: the background
reconciler (``reconcile_once``, every ``GMTS_RECONCILE_INTERVAL_S``) settles every unfinished record
from one listing of Ray's jobs and copies each live record's MLflow progress (parent run, trial
counts) into its row. List and get requests read that row and nothing else, so a slow or unreachable
Ray or MLflow never slows them down (a list that asked them would pay their latency once per client). Actions (submit, cancel, logs, results) do talk to Ray or MLflow. When a job ends, MLflow
runs it left open are closed — KILLED after a cancel (or any ``ray job stop``), FAILED after a crash
or for trial attempts that died and were restarted — so that the MLflow UI never shows a dead sweep
as running.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api.ray_jobs import RAY_TO_STATUS, JobNotFound, JobsBackend, JobState, RayUnavailable
from api.reaper import Leftovers, Reaper
from api.settings import ApiSettings
from api.store import (
    DuplicateIdempotencyKey,
    Kind,
    Submission,
    SubmissionStore,
    owner_only_database,
    owner_only_dir,
)
from api.submissions import PreparedJob, entrypoint, output_dir, prepare_run, prepare_sweep
from api.tracking_view import API_ID_TAG, RunLocation, TrackingView, TrialCounts
from sweeps.spec import BaseExperiment, SweepSpec

logger = logging.getLogger(__name__)

ID_PREFIX = {"sweep": "sw", "run": "run"}
# A record whose job Ray does not know is only declared lost after this long: the record is written
# just before the job is submitted, so a read in between must not fail it.
SUBMIT_GRACE_S = 60.0
# The message of an unfinished record while Ray does not answer: its status is the last one Ray gave.
RAY_UNREACHABLE = "Ray unreachable since"
CANCEL_POLL_S = 0.5


class NotFound(Exception):
    pass


class Conflict(Exception):
    """The request contradicts the record's state (cancel a finished sweep, reuse a key …)."""


class IdempotencyKeyReused(Exception):
    """The Idempotency-Key was used before with a different body (422, as the IETF draft says)."""


class Unavailable(Exception):
    """A dependency (Ray, MLflow, sweeps.report) is not there; 503."""


@dataclass
class View:
    """A record plus what MLflow said about it at the reconciler's last look, for a response."""

    record: Submission
    trials: TrialCounts
    ui_url: str | None
    warnings: list[str]


class ControlPlane:
    def __init__(self, settings: ApiSettings, jobs: JobsBackend, tracking: TrackingView) -> None:
        self.settings = settings
        self.jobs = jobs
        self.tracking = tracking
        # Owner-only: the records, job files and run outputs hold what users submitted and what it made.
        owner_only_dir(settings.state_dir)
        self.job_dir = owner_only_dir(settings.state_dir / "jobs")
        owner_only_dir(settings.state_dir / "runs")
        if settings.mlflow_tracking_uri is None:  # the default store sqlite:///<state>/mlflow.db
            owner_only_database(settings.state_dir / "mlflow.db")
        self.store = SubmissionStore(settings.state_dir / "api.db")
        self.reaper = Reaper(self.store, jobs, tracking, settings.kill_grace_s, settings.settle_quiet_s)
        self._stop = threading.Event()
        self._background: threading.Thread | None = None

    def close(self) -> None:
        self._stop.set()
        if self._background is not None:
            self._background.join(timeout=60)
        self.store.close()

    # -- the background reconciler ----------------------------------------------------------------

    def start_background(self, interval_s: float) -> None:
        """Reconcile with Ray and reap finished jobs every ``interval_s`` in a thread, from start-up on
        (so that the service answers /healthz at once, and records left unsettled by a previous
        process are repaired)."""
        self._background = threading.Thread(target=self._loop, args=(interval_s,), name="gmts-reconciler",
                                            daemon=True)
        self._background.start()

    def _loop(self, interval_s: float) -> None:
        while not self._stop.is_set():
            self.reconcile_once()
            self._stop.wait(interval_s)

    def reconcile_once(self) -> None:
        """One pass: statuses from Ray, reaping of finished jobs, then MLflow progress of every record
        that is unfinished or not yet settled (a settled record's runs are all closed: final)."""
        to_track = [record.id for record in (*self.store.unfinished(), *self.store.unsettled())]
        try:
            changed = self.reconcile_all()
            if changed:
                logger.info("reconciliation with Ray: %d record(s) changed", changed)
        except RayUnavailable as exc:
            logger.warning("reconciliation skipped: %s", exc)
            self._note_unreachable(exc)
        except Exception:  # noqa: BLE001 - the loop must survive whatever one pass hits
            logger.exception("reconciliation failed")
        for record in self.store.unsettled():
            if self._stop.is_set():
                return
            try:
                self.reaper.reap(record)
            except Exception:  # noqa: BLE001 - one record must not stop the others
                logger.exception("reaping %s failed", record.id)
        for api_id in to_track:
            record = self.store.by_id(api_id)
            if self._stop.is_set() or record is None:
                return
            self.track(record)

    def track(self, record: Submission) -> Submission:
        """Copy what MLflow says of the record (its run, trial counts) into its row; MLflow down: keep
        the last counts and say so in ``tracking_warning``."""
        try:
            location = self.tracking.locate(record)
        except Exception as exc:  # noqa: BLE001 - any MLflow failure: the next pass tries again
            return self.store.update(record, tracking_warning=f"MLflow at {self.tracking.uri} unreachable "
                                     f"({type(exc).__name__}); progress as of the last look")
        changes: dict[str, object] = {"tracking_warning": "", "tracked_at": time.time()}
        if location is not None:
            if location.exact and record.mlflow_run_id != location.run_id:
                # One id for users: the sweep's parent run gets the API id too (its children have it).
                try:
                    self.tracking.client.set_tag(location.run_id, API_ID_TAG, record.id)
                except Exception:  # noqa: BLE001 - tagged on a later pass
                    logger.warning("could not tag run %s with %s", location.run_id, record.id)
                changes["mlflow_run_id"] = location.run_id
            if location.exact:
                changes["mlflow_experiment_id"] = location.experiment_id
            counts = self.tracking.trial_counts(location, record.trials_total)
            changes.update(trials_running=counts.running, trials_finished=counts.finished,
                           trials_failed=counts.failed, trials_killed=counts.killed)
        return self.store.update(record, **changes)

    # -- submit ---------------------------------------------------------------------------------

    def submit(self, kind: Kind, body: SweepSpec | BaseExperiment, idempotency_key: str | None) -> tuple[Submission, bool]:
        """(record, replayed): replayed when the idempotency key already created this submission."""
        request_json = json.dumps(body.model_dump(mode="json"), sort_keys=True)
        request_hash = hashlib.sha256(request_json.encode()).hexdigest()
        if idempotency_key is not None:
            existing = self.store.by_idempotency_key(kind, idempotency_key)
            if existing is not None:
                return self._replay(existing, request_hash), True
        api_id = f"{ID_PREFIX[kind]}-{secrets.token_hex(8)}"
        prepared = prepare_sweep(body, self.settings, api_id) if kind == "sweep" else prepare_run(body, self.settings, api_id)
        job_file = self._write_job_file(api_id, prepared)
        now = time.time()
        record = Submission(
            id=api_id, kind=kind, name=prepared.name, status="pending", ray_submission_id=f"gmts-{api_id}",
            request_hash=request_hash, request_json=request_json, job_file=str(job_file),
            experiment=prepared.experiment, trials_total=prepared.trials_total, created_at=now, updated_at=now,
            idempotency_key=idempotency_key,
        )
        try:
            self.store.insert(record)
        except DuplicateIdempotencyKey as duplicate:  # a concurrent POST with the same key won the race
            job_file.unlink(missing_ok=True)
            return self._replay(duplicate.existing, request_hash), True
        if prepared.output_dir is not None:
            # Created here, 0700: whatever the job writes inside is out of other users' reach, whatever its mode.
            owner_only_dir(prepared.output_dir)
        try:
            self.jobs.submit(
                record.ray_submission_id,
                prepared.entrypoint(kind, job_file, output_dir(self.settings, api_id)),
                env_vars=self._job_env(api_id),
                metadata={"gmts.api_id": api_id, "gmts.kind": kind, "gmts.name": prepared.name},
            )
        except (RayUnavailable, RuntimeError) as exc:  # RuntimeError: Ray answered, but with an error
            # Not submitted: forget it, so that a retry with the same idempotency key starts afresh.
            self.store.delete(record.id)
            job_file.unlink(missing_ok=True)
            if prepared.output_dir is not None:
                with contextlib.suppress(OSError):  # still empty: nothing ran
                    prepared.output_dir.rmdir()
            reason = str(exc) if isinstance(exc, RayUnavailable) else f"Ray refused the job: {str(exc)[:300]}"
            raise Unavailable(reason) from None
        logger.info("submitted %s %s (%s) as Ray job %s", kind, api_id, prepared.name, record.ray_submission_id)
        return record, False

    @staticmethod
    def _replay(existing: Submission, request_hash: str) -> Submission:
        if existing.request_hash != request_hash:
            raise IdempotencyKeyReused(
                f"Idempotency-Key {existing.idempotency_key!r} was used for a different request body "
                f"(it created {existing.kind} {existing.id}); use a new key"
            )
        return existing

    def _write_job_file(self, api_id: str, prepared: PreparedJob) -> Path:
        path = self.job_dir / f"{api_id}.yaml"
        tmp = path.with_suffix(".tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
            file.write(prepared.job_yaml)
        os.replace(tmp, path)
        return path

    def _job_env(self, api_id: str) -> dict[str, str]:
        env = {"MLFLOW_TRACKING_URI": self.settings.tracking_uri(), "GMTS_API_ID": api_id}
        if self.settings.job_pythonpath:
            env["PYTHONPATH"] = self.settings.job_pythonpath
        if self.settings.storage:
            env["GMTS_STORAGE"] = self.settings.storage
        return env

    # -- reconcile with Ray ---------------------------------------------------------------------

    def get(self, kind: Kind, api_id: str) -> Submission:
        record = self.store.get(kind, api_id)
        if record is None:
            raise NotFound(f"no {kind} with id {api_id!r}")
        return record

    def refresh(self, record: Submission) -> Submission:
        """Bring an unfinished record up to date with Ray (Ray unreachable: left as it is). For actions
        (cancel), never for reads: those serve what the reconciler stored."""
        if record.finished:
            return record
        try:
            state = self.jobs.state(record.ray_submission_id)
        except JobNotFound:
            state = None
        except RayUnavailable as exc:
            logger.warning("cannot refresh %s: %s", record.id, exc)
            return record
        return self._settle(record, state)

    def reconcile_all(self) -> int:
        """Settle every unfinished record against one listing of Ray's jobs; the count changed."""
        unfinished = self.store.unfinished()
        if not unfinished:
            return 0
        states = self.jobs.states()
        changed = 0
        for record in unfinished:
            updated = self._settle(record, states.get(record.ray_submission_id))
            changed += updated.status != record.status
        return changed

    def _note_unreachable(self, exc: RayUnavailable) -> None:
        """Say on every unfinished record that its status is only the last one Ray gave (the head, or the whole
        cluster, may be gone with the job): once, from the first pass that found Ray silent."""
        since = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        for record in self.store.unfinished():
            if not record.message.startswith(RAY_UNREACHABLE):
                self.store.update(record, message=f"{RAY_UNREACHABLE} {since} ({str(exc)[:200]}): the job's state is "
                                  f"unknown, its status is the last one Ray gave")

    def _settle(self, record: Submission, state: JobState | None) -> Submission:
        if state is None:
            if time.time() - record.created_at < SUBMIT_GRACE_S and not record.message.startswith(RAY_UNREACHABLE):
                return record
            lost = (f"Ray has no job {record.ray_submission_id} (the cluster was replaced, or the submission never "
                    "reached it)")
            if record.kind == "sweep":
                lost += f"; POST /v1/sweeps/{record.id}/resume continues it from its last checkpoints"
            return self._finish(record, "failed", None, lost)
        status = RAY_TO_STATUS.get(state.status, record.status)
        if status in ("succeeded", "failed", "cancelled"):
            return self._finish(record, status, state.status, state.message)
        if (status != record.status or state.status != record.ray_status
                or record.message.startswith(RAY_UNREACHABLE)):
            return self.store.update(record, status=status, ray_status=state.status, message=state.message)
        return record

    def _finish(self, record: Submission, status: str, ray_status: str | None, message: str) -> Submission:
        """Terminal: check that nothing of the job runs on, close the MLflow runs it left open
        (api/reaper.py), copy MLflow's final trial counts, and only then store Ray's status — so that a
        reader never sees a finished sweep with the counts of a pass before (a crash in between leaves
        the record unfinished, and the next pass finishes it again; the record stays unsettled, so the
        background reconciler checks again)."""
        logger.info("%s %s is %s (%s)", record.kind, record.id, status, message)
        terminal = replace(record, status=status, ray_status=ray_status, message=message)
        reaped = self.track(self.reaper.reap(terminal)[0])
        return self.store.update(reaped, status=status, ray_status=ray_status, message=message)

    # -- resume ---------------------------------------------------------------------------------

    def resume(self, record: Submission) -> Submission:
        """Continue a failed or cancelled sweep from its state (``sweeps.run --resume``: finished trials stay
        finished, the others continue from their last checkpoints, in the same MLflow parent run) as a new Ray job
        under the same id. Refused while anything of the old job may still run (two drivers on one sweep)."""
        if record.kind != "sweep":
            raise Conflict("only sweeps resume; submit the run again")
        record = self.refresh(record)
        if not record.finished or record.status == "succeeded":
            raise Conflict(f"sweep {record.id} is {record.status}: only a failed or cancelled sweep resumes")
        if record.settled_at is None:
            record, leftovers = self.reaper.reap(record)
            if not leftovers.clear:
                raise Conflict(f"sweep {record.id} is still ending ({leftovers.describe()}); retry in a moment")
        previous = record.ray_submission_id.rpartition("-resume-")
        submission_id = f"gmts-{record.id}-resume-{int(previous[2]) + 1 if previous[1] else 1}"
        try:
            command = entrypoint("sweep", Path(record.job_file), output_dir(self.settings, record.id), resume=True)
            self.jobs.submit(submission_id, command, env_vars=self._job_env(record.id),
                             metadata={"gmts.api_id": record.id, "gmts.kind": "sweep", "gmts.name": record.name})
        except (RayUnavailable, RuntimeError) as exc:
            reason = str(exc) if isinstance(exc, RayUnavailable) else f"Ray refused the job: {str(exc)[:300]}"
            raise Unavailable(reason) from None
        logger.info("resumed sweep %s as Ray job %s (it was %s)", record.id, submission_id, record.status)
        return self.store.update(record, status="pending", ray_submission_id=submission_id, ray_status=None,
                                 message=f"resumed (it was {record.status}: {record.message[:300]})",
                                 cancel_requested=False, quiet_since=None, settled_at=None, kill_notes="")

    # -- cancel ---------------------------------------------------------------------------------

    def cancel(self, record: Submission) -> tuple[Submission, Leftovers | None]:
        """(record, what is left of the job): nothing left once Ray calls the job finished *and* a check
        found no driver, actor or open MLflow run of it (api/reaper.py). ``None`` or a non-clear
        Leftovers after ``cancel_wait_s`` (→ 202; the background reconciler goes on escalating). A
        repeat cancel (a client retrying after a timeout) gets the current state, not an error."""
        record = self.refresh(record)
        if not record.finished:
            logger.info("cancelling %s %s (Ray job %s)", record.kind, record.id, record.ray_submission_id)
            record = self.store.update(record, cancel_requested=True)
            try:
                self.jobs.stop(record.ray_submission_id)
            except JobNotFound:
                pass  # not (yet) known to Ray: refresh and the reaper decide
            except RayUnavailable as exc:
                raise Unavailable(str(exc)) from None
        record, leftovers = self._await_cancel(record)
        # As stored: the background reconciler reaps too, and may have been the one that killed.
        return self.store.by_id(record.id) or record, leftovers

    def _await_cancel(self, record: Submission) -> tuple[Submission, Leftovers | None]:
        deadline = time.monotonic() + self.settings.cancel_wait_s
        leftovers: Leftovers | None = None
        while True:
            record = self.refresh(record)
            if record.finished:
                if record.settled_at is not None:
                    return record, Leftovers()
                record, leftovers = self.reaper.reap(record)
                if leftovers.clear:
                    return self.track(record), leftovers
            if time.monotonic() >= deadline:
                return self.track(record), leftovers
            time.sleep(CANCEL_POLL_S)

    # -- views ----------------------------------------------------------------------------------

    def view(self, record: Submission) -> View:
        """The record as stored, nothing asked of Ray or MLflow (the reconciler keeps it fresh)."""
        trials = TrialCounts(total=record.trials_total, running=record.trials_running,
                             finished=record.trials_finished, failed=record.trials_failed,
                             killed=record.trials_killed)
        ui_url = None
        if record.mlflow_run_id and record.mlflow_experiment_id:
            ui_url = self.tracking.run_link(RunLocation(record.mlflow_run_id, record.mlflow_experiment_id, exact=True))
        warnings = [record.tracking_warning] if record.tracking_warning else []
        warnings += record.kill_notes.splitlines()  # what the reaper had to kill (api/reaper.py)
        return View(record, trials, ui_url, warnings)

    def results(self, record: Submission) -> tuple[str, TrialCounts, dict[str, Any]]:
        """(parent run id, trial counts, the ablation table): read from MLflow in the request."""
        try:
            location = self.tracking.locate(record)
        except Exception as exc:  # noqa: BLE001 - any MLflow failure here means: not available now
            raise Unavailable(f"MLflow at {self.tracking.uri} unreachable ({type(exc).__name__})") from None
        if location is None:
            if record.finished:
                raise Conflict(f"sweep {record.id} was {record.status} before it opened its MLflow parent run: "
                               "it has no results")
            raise Conflict(f"sweep {record.id} ({record.status}) has no MLflow parent run yet; try when it runs")
        try:
            table = self.tracking.ablation_results(location.run_id)
        except ImportError as exc:
            raise Unavailable(f"the ablation report is not available on this server ({exc})") from None
        return location.run_id, self.tracking.trial_counts(location, record.trials_total), table

    @staticmethod
    def results_note(record: Submission, trials: TrialCounts) -> str:
        """What a reader of the table must know about how complete it is."""
        done = f"{trials.finished} of {trials.total} trials finished"
        if record.status == "cancelled":
            return f"CANCELLED: the sweep was cancelled; the table holds only the trials that finished before ({done})"
        if record.status == "failed":
            return f"FAILED: the sweep failed ({record.message[:200]}); the table holds only finished trials ({done})"
        if not record.finished:
            return f"PARTIAL: the sweep is still {record.status}; {done} so far"
        return "" if trials.finished == trials.total else f"INCOMPLETE: {done}"

    def logs(self, record: Submission, tail: int) -> tuple[list[str], bool]:
        try:
            text = self.jobs.logs(record.ray_submission_id)
        except JobNotFound:
            raise NotFound(f"Ray has no job {record.ray_submission_id} (and so no log)") from None
        except RayUnavailable as exc:
            raise Unavailable(str(exc)) from None
        lines = text.splitlines()
        return lines[-tail:], len(lines) > tail

