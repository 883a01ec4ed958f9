"""Where one sweep keeps its files, and the record that lets ``--resume`` find it again.

    <output_dir>/
      mlflow.db, mlartifacts/          the default MLflow store (shared by all sweeps there)
      ray_results/<sweep_id>/          Ray Tune's experiment folder (trial state, checkpoint markers)
      <sweep_id>/sweep.json            this record; spec.yaml (the resolved spec)
      <sweep_id>/<trial name>/         each trial's run_dir: its real checkpoints
      <sweep_id>/report/               the ablation report (also the parent run's artifacts)

With ``--storage URI`` (an object store, ``sweeps.storage``) the durable part moves there: ``<URI>/<sweep_id>/``
holds the record and spec, ``<URI>/ray_results/<sweep_id>/`` Tune's state with each trial's real checkpoint, and
``<URI>/mlartifacts/`` the artifacts of a local MLflow store; ``<output_dir>`` keeps the working copies.

Each sweep gets a fresh ``sweep_id`` (spec name + UTC time, or the caller's ``--sweep-id``: the API
passes its ``sw-…`` id, so a sweep has one id everywhere), so that a new sweep never picks up
the checkpoints of an older one; ``--resume`` reopens the newest sweep of the spec (or a given id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import yaml
from pydantic import BaseModel

from orchestrator.config_loader import ConfigError
from sweeps.spec import SweepSpec
from sweeps.storage import SweepStorage

RECORD_FILE = "sweep.json"
# A sweep id names folders and MLflow runs: letters, digits, '.', '_', '-'; no path separators.
SWEEP_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SweepRecord(BaseModel):
    sweep_id: str
    spec_name: str
    spec_hash: str
    tracking_uri: str
    created: datetime
    spec: dict[str, Any]


@dataclass(frozen=True)
class SweepLayout:
    output_dir: Path
    sweep_id: str
    storage: SweepStorage | None = None  # None: the output dir itself

    @property
    def durable(self) -> SweepStorage:
        return self.storage or SweepStorage.at(self.output_dir)

    @property
    def sweep_dir(self) -> Path:
        return self.output_dir / self.sweep_id

    @property
    def spec_file(self) -> Path:
        return self.sweep_dir / "spec.yaml"

    @property
    def tune_storage(self) -> str:
        return self.durable.path("ray_results")

    @property
    def tune_dir(self) -> str:
        return self.durable.path("ray_results", self.sweep_id)

    @property
    def tune_filesystem(self) -> pafs.FileSystem | None:
        """Tune's ``storage_filesystem``: None for a folder, which Tune then opens as it always has."""
        return self.durable.filesystem if self.durable.remote else None


def new_record(spec: SweepSpec, output_dir: Path, tracking_uri: str, sweep_id: str | None = None,
               storage: SweepStorage | None = None) -> SweepRecord:
    """A new sweep's record; its id is ``sweep_id`` when the caller has one (the API passes its own
    ``sw-…`` id, so that users see one id), else ``<spec name>-<UTC time>``."""
    now = datetime.now(UTC)

    def taken(name: str) -> bool:
        return (output_dir / name).exists() or (storage is not None and storage.exists(name))

    if sweep_id is not None:
        if not SWEEP_ID_PATTERN.fullmatch(sweep_id):
            raise ConfigError(f"--sweep-id: {sweep_id!r} must match {SWEEP_ID_PATTERN.pattern} (it names a folder)")
        if taken(sweep_id):
            raise ConfigError(f"--sweep-id: sweep {sweep_id!r} exists in {output_dir}; use --resume {sweep_id} to continue it")
    else:
        base = f"{spec.name}-{now:%Y%m%d-%H%M%S}"
        sweep_id, n = base, 1
        while taken(sweep_id):  # two sweeps started within one second
            n += 1
            sweep_id = f"{base}-{n}"
    return SweepRecord(
        sweep_id=sweep_id,
        spec_name=spec.name,
        spec_hash=spec.spec_hash(),
        tracking_uri=tracking_uri,
        created=now,
        spec=spec.model_dump(mode="json"),
    )


def save_record(record: SweepRecord, layout: SweepLayout) -> None:
    """Beside the run folders, and in the durable storage when that is elsewhere (``--resume`` reads it there)."""
    layout.sweep_dir.mkdir(parents=True, exist_ok=True)
    texts = {RECORD_FILE: record.model_dump_json(indent=2),
             layout.spec_file.name: yaml.safe_dump(record.spec, sort_keys=False)}
    for name, text in texts.items():
        (layout.sweep_dir / name).write_text(text)
        if layout.durable.remote:
            layout.durable.write_text(text, record.sweep_id, name)


def find_record(output_dir: Path, spec: SweepSpec, sweep_id: str | None = None,
                storage: SweepStorage | None = None) -> SweepRecord:
    """The sweep to resume: ``sweep_id`` if given, else the newest sweep of this spec in the storage
    (default: ``output_dir``).

    Raises ConfigError when there is none, or when the spec changed since (a resumed sweep must
    rerun the same trials, or its table would mix two grids).
    """
    storage = storage or SweepStorage.at(output_dir)
    if sweep_id is not None:
        if not SWEEP_ID_PATTERN.fullmatch(sweep_id) or not storage.exists(sweep_id, RECORD_FILE):
            raise ConfigError(f"--resume: no sweep {sweep_id!r} in {storage.uri} "
                              f"(no {storage.path(sweep_id, RECORD_FILE)})")
        record = SweepRecord.model_validate_json(storage.read_text(sweep_id, RECORD_FILE))
    else:
        records = [SweepRecord.model_validate_json(storage.read_text(folder, RECORD_FILE))
                   for folder in storage.folders_holding(RECORD_FILE)]
        records = [r for r in records if r.spec_name == spec.name]
        if not records:
            raise ConfigError(f"--resume: no earlier sweep of spec {spec.name!r} in {storage.uri}")
        record = max(records, key=lambda r: r.created)
    if record.spec_name != spec.name or record.spec_hash != spec.spec_hash():
        raise ConfigError(
            f"--resume: the spec differs from sweep {record.sweep_id!r}'s (hash {spec.spec_hash()} vs "
            f"{record.spec_hash}); resume with the same spec and --set values, or start a new sweep"
        )
    return record
