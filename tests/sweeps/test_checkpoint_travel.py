"""A sweep on an object store: a trial's checkpoint travels through Tune and back into a run folder, and the
learner ranks' files reach the driver's folder (the end-to-end case is the faulted sweep of test_sweep_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.checkpointing import RUN_STATE, latest_checkpoint, step_dir
from sweeps.trainable import take_back
from workers.learner.checkpoint_files import files_under, write_files


def _checkpoint(folder: Path, step: int) -> Path:
    (folder / "learner").mkdir(parents=True)
    (folder / "learner" / "mp_rank_00_model_states.pt").write_bytes(b"weights" * 100)
    (folder / "latest").write_text("learner")
    (folder / "base_reference.pt").write_bytes(b"base answers")
    (folder / RUN_STATE).write_text(json.dumps({"step": step, "sampler": {}}))
    return folder


def test_a_checkpoint_handed_back_by_tune_is_where_resume_looks(tmp_path: Path) -> None:
    handed = _checkpoint(tmp_path / "from_tune", 4)
    run_dir = tmp_path / "node_b" / "t000"  # another node: nothing of the run there yet
    target = take_back(handed, run_dir)
    assert target == step_dir(run_dir, 4)
    found = latest_checkpoint(run_dir)
    assert found is not None and found[0] == target and found[1]["step"] == 4
    assert (target / "learner" / "mp_rank_00_model_states.pt").read_bytes() == b"weights" * 100
    # The run's own files go back to the run folder, where train(resume=True) reads them.
    assert (run_dir / "base_reference.pt").read_bytes() == b"base answers"
    assert not (target / "base_reference.pt").exists()


def test_a_cut_short_folder_is_replaced_and_a_complete_one_kept(tmp_path: Path) -> None:
    handed = _checkpoint(tmp_path / "from_tune", 2)
    run_dir = tmp_path / "run"
    partial = step_dir(run_dir, 2)
    (partial / "learner").mkdir(parents=True)
    (partial / "learner" / "mp_rank_00_model_states.pt").write_bytes(b"half")  # no run state: a save cut short
    take_back(handed, run_dir)
    assert (partial / "learner" / "mp_rank_00_model_states.pt").read_bytes() == b"weights" * 100
    (partial / "learner" / "mp_rank_00_model_states.pt").write_bytes(b"written here")  # complete: this node's own
    take_back(handed, run_dir)
    assert (partial / "learner" / "mp_rank_00_model_states.pt").read_bytes() == b"written here"


def test_checkpoint_files_cross_to_another_disk_whole(tmp_path: Path) -> None:
    source = _checkpoint(tmp_path / "rank1_disk", 2)
    files = files_under(source)
    assert sorted(files) == ["base_reference.pt", "latest", "learner/mp_rank_00_model_states.pt", RUN_STATE]
    driver_disk = tmp_path / "driver_disk"
    (driver_disk / "learner").mkdir(parents=True)
    (driver_disk / "learner" / "mp_rank_00_model_states.pt").write_bytes(b"rank 0 wrote it here")
    write_files(driver_disk, files)
    assert files_under(driver_disk) == {**files, "learner/mp_rank_00_model_states.pt": b"rank 0 wrote it here"}
    assert not list(driver_disk.rglob("*.partial"))
