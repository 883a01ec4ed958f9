"""Where one sweep keeps its files, and the record that lets ``--resume`` find it again.

    <output_dir>/
      mlflow.db, mlartifacts/          the default MLflow store (shared by all sweeps there)
      ray_results/<sweep_id>/          Ray Tune's experiment folder (trial state, checkpoint markers)
      <sweep_id>/sweep.json            this record; spec.yaml (the resolved spec)
      <sweep_id>/<trial name>/         each trial's run_dir: its real checkpoints

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

import yaml
from pydantic import BaseModel

from orchestrator.config_loader import ConfigError
from sweeps.spec import SweepSpec

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

    @property
    def sweep_dir(self) -> Path:
        return self.output_dir / self.sweep_id

    @property
    def record_file(self) -> Path:
        return self.sweep_dir / RECORD_FILE

    @property
    def spec_file(self) -> Path:
        return self.sweep_dir / "spec.yaml"

    @property
    def tune_storage(self) -> Path:
        return self.output_dir / "ray_results"

    @property
    def tune_dir(self) -> Path:
        return self.tune_storage / self.sweep_id


def new_record(spec: SweepSpec, output_dir: Path, tracking_uri: str, sweep_id: str | None = None) -> SweepRecord:
    """A new sweep's record; its id is ``sweep_id`` when the caller has one (the API passes its own
    ``sw-…`` id, so that users see one id), else ``<spec name>-<UTC time>``."""
    now = datetime.now(UTC)
    if sweep_id is not None:
        if not SWEEP_ID_PATTERN.fullmatch(sweep_id):
            raise ConfigError(f"--sweep-id: {sweep_id!r} must match {SWEEP_ID_PATTERN.pattern} (it names a folder)")
        if (output_dir / sweep_id).exists():
            raise ConfigError(f"--sweep-id: sweep {sweep_id!r} exists in {output_dir}; use --resume {sweep_id} to continue it")
    else:
        base = f"{spec.name}-{now:%Y%m%d-%H%M%S}"
        sweep_id, n = base, 1
        while (output_dir / sweep_id).exists():  # two sweeps started within one second
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
    layout.sweep_dir.mkdir(parents=True, exist_ok=True)
    layout.record_file.write_text(record.model_dump_json(indent=2))
    layout.spec_file.write_text(yaml.safe_dump(record.spec, sort_keys=False))


def find_record(output_dir: Path, spec: SweepSpec, sweep_id: str | None = None) -> SweepRecord:
    """The sweep to resume: ``sweep_id`` if given, else the newest sweep of this spec in ``output_dir``.

    Raises ConfigError when there is none, or when the spec changed since (a resumed sweep must
    rerun the same trials, or its table would mix two grids).
    """
    if sweep_id is not None:
        file = output_dir / sweep_id / RECORD_FILE
        if not file.is_file():
            raise ConfigError(f"--resume: no sweep {sweep_id!r} in {output_dir} (no {file})")
        record = SweepRecord.model_validate_json(file.read_text())
    else:
        records = [SweepRecord.model_validate_json(f.read_text()) for f in output_dir.glob(f"*/{RECORD_FILE}")]
        records = [r for r in records if r.spec_name == spec.name]
        if not records:
            raise ConfigError(f"--resume: no earlier sweep of spec {spec.name!r} in {output_dir}")
        record = max(records, key=lambda r: r.created)
    if record.spec_name != spec.name or record.spec_hash != spec.spec_hash():
        raise ConfigError(
            f"--resume: the spec differs from sweep {record.sweep_id!r}'s (hash {spec.spec_hash()} vs "
            f"{record.spec_hash}); resume with the same spec and --set values, or start a new sweep"
        )
    return record
