"""Run checkpoints: the learners' DeepSpeed state plus the loop's own state, saved every K steps.

Layout: ``<run_dir>/checkpoints/step_000040/`` holds the DeepSpeed checkpoint (model, optimizer,
scheduler of every rank) and ``run_state.json`` (step, data position, next group id, the batches collected
ahead with ``rollout.max_staleness``, MLflow run
id), written last: a folder without it is an interrupted save and is ignored on resume.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

RUN_STATE = "run_state.json"


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    return checkpoint_root(run_dir) / f"step_{step:06d}"


def write_run_state(folder: Path, state: dict[str, Any]) -> None:
    tmp = folder / f".{RUN_STATE}.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(folder / RUN_STATE)  # atomic: the marker that the checkpoint is complete


def latest_checkpoint(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return None
    for folder in sorted(root.glob("step_*"), reverse=True):
        state_file = folder / RUN_STATE
        if state_file.is_file():
            return folder, json.loads(state_file.read_text())
    return None


def prune(run_dir: Path, keep_last: int) -> None:
    complete = [f for f in sorted(checkpoint_root(run_dir).glob("step_*")) if (f / RUN_STATE).is_file()]
    for folder in complete[:-keep_last]:
        shutil.rmtree(folder, ignore_errors=True)
