"""Cancel is a promise: after a job has ended, nothing of it may run on, and MLflow must say so.

Ray's ``STOPPED`` is a statement about Ray's bookkeeping, not about processes: a driver that
started late (a cancel ≈ 1 s after submit), or one slow to die, can go on starting actors and
opening MLflow runs after Ray said the job was stopped. So for every finished record the reaper
checks, again and again, what is actually there:

- the job's **driver**: local processes whose command line is ``api.job … <its job file>`` (the file
  is unique per submission, so this finds a driver even where Ray lost track of it), plus the
  driver Ray's state API lists as alive for the job's Ray JobID;
- the job's **actors**: every actor of that JobID that Ray's state API does not list as dead;
- its **MLflow runs**: every run of it still RUNNING/SCHEDULED.

and repairs what disagrees, escalating on each pass: the Ray job is stopped again if Ray does not
call it finished; a live driver or actor process on this host gets SIGTERM, then — if it is still
there ``GMTS_KILL_GRACE_S`` (5 s) later — SIGKILL, with its children (a driver's death also makes Ray kill
the job's actors, which is how actors on other hosts end); open runs are closed (KILLED after a
cancel). Each signal is noted in the record (``kill_notes``: what, its pid, which signal) and shown
among its ``warnings``, so that a cancel that had to kill says so. A record is *settled*
(``settled_at``) once checks over ``GMTS_SETTLE_QUIET_S`` (30 s) since the job ended all came back
empty, so that a driver that starts late is still caught. The checks run in the service's background
reconciler — after an API restart too, since the state is in SQLite — and,
for a cancel, right in the request, which answers 200 only once a check came back empty.

Processes are only signalled when they are provably this job's: the driver by its job file in its
command line, an actor by its pid being a child of the raylet of the node Ray names for it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field, replace

import psutil

from api.ray_jobs import JobNotFound, JobsBackend, JobState, LiveProcess, RayUnavailable
from api.store import Submission, SubmissionStore
from api.tracking_view import TrackingView

logger = logging.getLogger(__name__)

# Job status → (status for the trial runs it left open, for its parent run if still open); after a
# success the only open runs are those of trial attempts that died and were restarted by Tune.
CLOSING: dict[str, tuple[str, str | None]] = {
    "cancelled": ("KILLED", "KILLED"),
    "failed": ("FAILED", "FAILED"),
    "succeeded": ("FAILED", None),
}


@dataclass
class Leftovers:
    """What one check found still there of a finished job."""

    ray_job: str | None = None  # Ray's status when Ray does not call the job finished
    local_drivers: list[int] = field(default_factory=list)
    ray_processes: list[LiveProcess] = field(default_factory=list)
    open_runs: int = 0
    unknown: list[str] = field(default_factory=list)  # what could not be checked (Ray / MLflow down)

    @property
    def clear(self) -> bool:
        return not (self.ray_job or self.local_drivers or self.ray_processes or self.open_runs or self.unknown)

    def describe(self) -> str:
        parts = []
        if self.ray_job:
            parts.append(f"Ray still says {self.ray_job}")
        if self.local_drivers:
            parts.append(f"driver process(es) {self.local_drivers} alive")
        parts += [process.describe() + " alive" for process in self.ray_processes]
        if self.open_runs:
            parts.append(f"{self.open_runs} MLflow run(s) were still open (now closed)")
        parts += self.unknown
        return "; ".join(parts) or "nothing left"


class Reaper:
    def __init__(self, store: SubmissionStore, jobs: JobsBackend, tracking: TrackingView,
                 kill_grace_s: float, quiet_s: float) -> None:
        self.store = store
        self.jobs = jobs
        self.tracking = tracking
        self.kill_grace_s = kill_grace_s
        self.quiet_s = quiet_s
        self._termed: dict[int, float] = {}  # pid → when it got SIGTERM

    def reap(self, record: Submission) -> tuple[Submission, Leftovers]:
        """One check-and-repair pass over a finished record; settles it after a quiet period."""
        leftovers = Leftovers()
        state = self._ray_state(record, leftovers)
        if state is not None and state.status in ("PENDING", "RUNNING"):
            leftovers.ray_job = state.status
            try:
                self.jobs.stop(record.ray_submission_id)
            except (JobNotFound, RayUnavailable) as exc:
                leftovers.unknown.append(f"could not stop the Ray job again ({type(exc).__name__})")
        leftovers.local_drivers = local_drivers(record.job_file)
        if state is not None and state.job_id:
            try:
                leftovers.ray_processes = self.jobs.live_processes(state.job_id, state.driver_pid)
            except RayUnavailable as exc:
                leftovers.unknown.append(f"Ray's state API unreachable ({exc})")
        record = self._note_kills(record, self._signal(record, leftovers))
        leftovers.open_runs = self._close_runs(record, leftovers)
        if not leftovers.clear:
            logger.warning("%s %s is %s but: %s", record.kind, record.id, record.status, leftovers.describe())
            record = self.store.update(record, quiet_since=None)
        elif record.quiet_since is None:
            record = self.store.update(record, quiet_since=time.time())
        elif time.time() - record.quiet_since >= self.quiet_s and record.settled_at is None:
            record = self.store.update(record, settled_at=time.time())
            logger.info("%s %s settled: no driver, actor or open MLflow run left", record.kind, record.id)
        return record, leftovers

    def _ray_state(self, record: Submission, leftovers: Leftovers) -> JobState | None:
        try:
            return self.jobs.state(record.ray_submission_id)
        except JobNotFound:
            return None
        except RayUnavailable as exc:
            leftovers.unknown.append(f"Ray unreachable ({exc})")
            return None

    def _signal(self, record: Submission, leftovers: Leftovers) -> list[str]:
        """SIGTERM what is left on this host, SIGKILL what outlived the grace period; a note for each."""
        targets = {pid: "the job's driver" for pid in leftovers.local_drivers}
        for process in leftovers.ray_processes:
            if process.pid and process.pid not in targets and is_ray_worker_of_node(process.pid, process.node_id):
                targets[process.pid] = ("the job's driver" if process.kind == "driver"
                                        else f"the job's actor {process.name or process.ray_id[:12]}")
        notes = []
        for pid, what in targets.items():
            first = self._termed.setdefault(pid, time.monotonic())
            escalate = time.monotonic() - first >= self.kill_grace_s
            sig = signal.SIGKILL if escalate else signal.SIGTERM
            if kill_tree(pid, sig):
                notes.append(kill_note(record, what, pid, sig, self.kill_grace_s))
        self._termed = {pid: t for pid, t in self._termed.items() if psutil.pid_exists(pid)}
        return notes

    def _note_kills(self, record: Submission, notes: list[str]) -> Submission:
        """Add the notes to the record's (from the store: the cancel request and the background
        reconciler both reap); a signal repeated on a later pass, or after a restart, is noted once."""
        if not notes:
            return record
        stored = self.store.by_id(record.id) or record
        known = stored.kill_notes.splitlines()
        new = [note for note in dict.fromkeys(notes) if note not in known]
        if new:
            return self.store.update(record, kill_notes="\n".join([*known, *new]))
        return replace(record, kill_notes=stored.kill_notes)

    def _close_runs(self, record: Submission, leftovers: Leftovers) -> int:
        trial_status, parent_status = CLOSING[record.status]
        try:
            location = self.tracking.locate(record)
            if location is None:
                return 0
            return self.tracking.close_runs(location, trial_status, parent_status,
                                            force_parent=record.status == "cancelled")
        except Exception as exc:  # noqa: BLE001 - MLflow down: check again on the next pass
            leftovers.unknown.append(f"MLflow unreachable ({type(exc).__name__})")
            return 0


def local_drivers(job_file: str) -> list[int]:
    """Processes on this host running this submission's job (``… api.job <kind> <job_file> …``)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if job_file in cmdline and any("api.job" in part for part in cmdline) and process.pid != os.getpid():
            found.append(process.pid)
    return found


def is_ray_worker_of_node(pid: int, node_id: str | None) -> bool:
    """True if ``pid`` is a worker process started by the raylet of ``node_id`` on this host (so a pid
    Ray reports for another host, or for another cluster's node, is never signalled)."""
    if not node_id:
        return False
    try:
        process = psutil.Process(pid)
        for ancestor in process.parents()[:3]:
            cmdline = ancestor.cmdline()
            if cmdline and "raylet" in os.path.basename(cmdline[0]) and any(node_id in part for part in cmdline):
                return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return False


def kill_note(record: Submission, what: str, pid: int, sig: signal.Signals, grace_s: float) -> str:
    """One line for the record's warnings: the job ended (a cancel: Ray stopped it), yet this was alive."""
    when = "cancel: " if record.status == "cancelled" else f"{record.status} job: "
    outlived = "Ray's stop" if record.status == "cancelled" else "the job's end"
    if sig == signal.SIGKILL and grace_s > 0:
        return f"{when}{what} (pid {pid}) was still alive {grace_s:g} s after SIGTERM; sent SIGKILL"
    return f"{when}{what} (pid {pid}) outlived {outlived}; sent {sig.name}"


def kill_tree(pid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``pid`` and its descendants; False if ``pid`` was gone."""
    try:
        process = psutil.Process(pid)
        family = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for member in family:
        try:
            member.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    logger.warning("sent %s to pid %d and %d descendant(s)", sig.name, pid, len(family) - 1)
    return True
