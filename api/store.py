"""SQLite records of every submitted sweep and run: what was asked, its Ray submission id, its status.

The record is written before the Ray job is submitted, under a submission id chosen here, so that a
crash between the two leaves a record that start-up reconciliation can settle (Ray either has a job
of that id or never got one). ``(kind, idempotency_key)`` is unique: two POSTs with the same key
race on one INSERT and exactly one of them creates the sweep.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Literal

Kind = Literal["sweep", "run"]
Status = Literal["pending", "running", "succeeded", "failed", "cancelled"]
TERMINAL: tuple[str, ...] = ("succeeded", "failed", "cancelled")

SCHEMA = """
CREATE TABLE IF NOT EXISTS submissions (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    ray_submission_id TEXT NOT NULL UNIQUE,
    ray_status TEXT,
    message TEXT NOT NULL DEFAULT '',
    idempotency_key TEXT,
    request_hash TEXT NOT NULL,
    request_json TEXT NOT NULL,
    job_file TEXT NOT NULL,
    experiment TEXT NOT NULL,
    trials_total INTEGER NOT NULL,
    mlflow_run_id TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    quiet_since REAL,
    settled_at REAL,
    trials_running INTEGER NOT NULL DEFAULT 0,
    trials_finished INTEGER NOT NULL DEFAULT 0,
    trials_failed INTEGER NOT NULL DEFAULT 0,
    trials_killed INTEGER NOT NULL DEFAULT 0,
    mlflow_experiment_id TEXT,
    tracking_warning TEXT NOT NULL DEFAULT '',
    tracked_at REAL,
    kill_notes TEXT NOT NULL DEFAULT '',
    UNIQUE (kind, idempotency_key)
);
CREATE INDEX IF NOT EXISTS submissions_by_status ON submissions (status);
"""
# Columns added after the first release: (name, SQL type) added to an older database on open.
ADDED_COLUMNS = (
    ("quiet_since", "REAL"), ("settled_at", "REAL"),
    ("trials_running", "INTEGER NOT NULL DEFAULT 0"), ("trials_finished", "INTEGER NOT NULL DEFAULT 0"),
    ("trials_failed", "INTEGER NOT NULL DEFAULT 0"), ("trials_killed", "INTEGER NOT NULL DEFAULT 0"),
    ("mlflow_experiment_id", "TEXT"), ("tracking_warning", "TEXT NOT NULL DEFAULT ''"), ("tracked_at", "REAL"),
    ("kill_notes", "TEXT NOT NULL DEFAULT ''"),
)


@dataclass(frozen=True)
class Submission:
    id: str
    kind: Kind
    name: str
    status: Status
    ray_submission_id: str
    request_hash: str
    request_json: str
    job_file: str
    experiment: str
    trials_total: int
    created_at: float
    updated_at: float
    ray_status: str | None = None
    message: str = ""
    idempotency_key: str | None = None
    mlflow_run_id: str | None = None  # the sweep's parent run, or the single run's own run
    cancel_requested: bool = False
    # api/reaper.py: since when checks found nothing of the finished job left; when that held long enough.
    quiet_since: float | None = None
    settled_at: float | None = None
    # What MLflow said at the reconciler's last look (api/service.py ControlPlane.track): reads serve
    # these, so that no list/get request waits on MLflow.
    trials_running: int = 0
    trials_finished: int = 0
    trials_failed: int = 0
    trials_killed: int = 0
    mlflow_experiment_id: str | None = None
    tracking_warning: str = ""
    tracked_at: float | None = None
    # api/reaper.py: what it had to signal because it outlived the job, one line each (shown as warnings).
    kill_notes: str = ""

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


class DuplicateIdempotencyKey(Exception):
    def __init__(self, existing: Submission) -> None:
        super().__init__(existing.id)
        self.existing = existing


class SubmissionStore:
    """One SQLite file; a lock serialises writers from FastAPI's thread pool.

    ``version`` counts the writes made through this store: the read cache (api/reads.py) serves a
    response as long as it is unchanged. This process is the database's only writer (the reconciler
    runs in it), so the counter sees every change."""

    def __init__(self, path: Path) -> None:
        owner_only_dir(path.parent)
        self.path = path
        owner_only_database(path)
        self._lock = threading.Lock()
        self.version = 0
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        present = {row["name"] for row in self._db.execute("PRAGMA table_info(submissions)")}
        for column, sql_type in ADDED_COLUMNS:
            if column not in present:
                self._db.execute(f"ALTER TABLE submissions ADD COLUMN {column} {sql_type}")
        owner_only_database(path)  # the -wal/-shm files exist now

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def insert(self, record: Submission) -> Submission:
        """Insert, or raise DuplicateIdempotencyKey carrying the record that owns the key."""
        columns = [f.name for f in fields(Submission)]
        values = [getattr(record, name) for name in columns]
        with self._lock:
            try:
                self._db.execute(
                    f"INSERT INTO submissions ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                    values,
                )
                self.version += 1
                return record
            except sqlite3.IntegrityError:
                row = self._db.execute(
                    "SELECT * FROM submissions WHERE kind = ? AND idempotency_key = ?",
                    (record.kind, record.idempotency_key),
                ).fetchone()
                if row is None:
                    raise
        raise DuplicateIdempotencyKey(_record(row))

    def get(self, kind: Kind, submission_id: str) -> Submission | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM submissions WHERE kind = ? AND id = ?", (kind, submission_id)
            ).fetchone()
        return None if row is None else _record(row)

    def by_id(self, submission_id: str) -> Submission | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM submissions WHERE id = ?", (submission_id,)).fetchone()
        return None if row is None else _record(row)

    def by_idempotency_key(self, kind: Kind, key: str) -> Submission | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM submissions WHERE kind = ? AND idempotency_key = ?", (kind, key)
            ).fetchone()
        return None if row is None else _record(row)

    def delete(self, submission_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM submissions WHERE id = ?", (submission_id,))
            self.version += 1

    def list(self, kind: Kind, limit: int = 100, status: str | None = None) -> list[Submission]:
        query, args = "SELECT * FROM submissions WHERE kind = ?", [kind]
        if status is not None:
            query, args = query + " AND status = ?", args + [status]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at DESC LIMIT ?", (*args, limit)).fetchall()
        return [_record(row) for row in rows]

    def unfinished(self) -> list[Submission]:
        marks = ", ".join("?" for _ in TERMINAL)
        with self._lock:
            rows = self._db.execute(f"SELECT * FROM submissions WHERE status NOT IN ({marks})", TERMINAL).fetchall()
        return [_record(row) for row in rows]

    def unsettled(self) -> list[Submission]:
        """Finished records whose end the reaper has not confirmed yet (api/reaper.py)."""
        marks = ", ".join("?" for _ in TERMINAL)
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM submissions WHERE status IN ({marks}) AND settled_at IS NULL", TERMINAL).fetchall()
        return [_record(row) for row in rows]

    def update(self, record: Submission, **changes: object) -> Submission:
        updated = replace(record, **changes, updated_at=time.time())
        assignments = ", ".join(f"{name} = ?" for name in changes)
        with self._lock:
            self._db.execute(
                f"UPDATE submissions SET {assignments}, updated_at = ? WHERE id = ?",
                (*changes.values(), updated.updated_at, record.id),
            )
            self.version += 1
        return updated


def owner_only_database(path: Path) -> None:
    """A SQLite database only its owner can read (the records hold what users submitted; MLflow's
    store what their runs logged): 0600 for the file and its side files.

    SQLite creates -wal/-shm (and -journal) with the database file's mode, so creating the file 0600
    first is what keeps them private (an empty file is an empty database to SQLite); a database left
    0644 by an older version is tightened, its side files too."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for file in (path, *(path.with_name(path.name + side) for side in ("-wal", "-shm", "-journal"))):
        if file.exists() and stat.S_IMODE(file.stat().st_mode) != 0o600:
            file.chmod(0o600)


def owner_only_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter: created 0700 with every missing parent (no
    umask decides), or tightened to 0700 if it exists (a state dir made 0755 by hand or by an older
    version). Existing parents are left alone: they are not the service's."""
    missing, folder = [], path
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        folder.chmod(0o700)  # mkdir's mode passes through the umask
    if stat.S_IMODE(path.stat().st_mode) != 0o700:
        try:
            path.chmod(0o700)
        except PermissionError:
            raise PermissionError(f"{path} is not owner-only (0700) and this user cannot make it so: the service's "
                                  "folders (GMTS_STATE_DIR) must belong to the user that runs it") from None
    return path


def _record(row: sqlite3.Row) -> Submission:
    data = dict(row)
    data["cancel_requested"] = bool(data["cancel_requested"])
    return Submission(**data)
