"""Sweep records: what ``--resume`` finds, and what it refuses, before anything starts."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import ray

from orchestrator.config_loader import ConfigError
from sweeps import run as sweep_cli
from sweeps.layout import SweepLayout, find_record, new_record, save_record
from sweeps.runner import prepare_sweep
from sweeps.spec import load_spec


def _save(spec, output: Path, shift_seconds: int = 0):
    record = new_record(spec, output, "sqlite:///unused.db")
    record = record.model_copy(update={"created": record.created + timedelta(seconds=shift_seconds)})
    save_record(record, SweepLayout(output, record.sweep_id))
    return record


def test_new_sweeps_get_distinct_ids_and_trial_folders(write_spec, tmp_path: Path) -> None:
    spec = load_spec(write_spec(grid={"method": ["ets"], "ratio": [0.2]}))
    first, second = _save(spec, tmp_path), _save(spec, tmp_path)
    assert first.sweep_id != second.sweep_id and first.sweep_id.startswith("test-sweep-")
    prepared = prepare_sweep(spec, tmp_path)
    assert prepared.trials[0].config.run_dir == tmp_path.resolve() / prepared.record.sweep_id / "test-sweep-t000"


def test_a_given_sweep_id_names_the_sweep_and_is_checked(write_spec, tmp_path: Path) -> None:
    """The API runs each sweep under its own sw-… id (one id for users); a bad or taken id is refused."""
    spec = load_spec(write_spec(grid={"method": ["ets"], "ratio": [0.2]}))
    prepared = prepare_sweep(spec, tmp_path, sweep_id="sw-0123456789abcdef")
    assert prepared.record.sweep_id == "sw-0123456789abcdef"
    assert prepared.trials[0].config.run_dir == tmp_path.resolve() / "sw-0123456789abcdef" / "test-sweep-t000"
    save_record(prepared.record, prepared.layout)
    with pytest.raises(ConfigError, match="--sweep-id: sweep 'sw-0123456789abcdef' exists"):
        prepare_sweep(spec, tmp_path, sweep_id="sw-0123456789abcdef")
    with pytest.raises(ConfigError, match="--sweep-id: '../x' must match"):
        prepare_sweep(spec, tmp_path, sweep_id="../x")


def test_resume_finds_the_newest_sweep_of_the_spec_or_the_given_one(write_spec, tmp_path: Path) -> None:
    spec = load_spec(write_spec(grid={"method": ["ets"], "ratio": [0.2]}))
    older, newer = _save(spec, tmp_path, -60), _save(spec, tmp_path)
    assert find_record(tmp_path, spec).sweep_id == newer.sweep_id
    assert find_record(tmp_path, spec, older.sweep_id).sweep_id == older.sweep_id
    with pytest.raises(ConfigError, match="no sweep 'nope'"):
        find_record(tmp_path, spec, "nope")


def test_resume_with_a_changed_spec_is_refused(write_spec, tmp_path: Path) -> None:
    path = write_spec(grid={"method": ["ets"], "ratio": [0.2]})
    _save(load_spec(path), tmp_path)
    with pytest.raises(ConfigError, match="the spec differs"):
        find_record(tmp_path, load_spec(path, ["grid.ratio=[0.5]"]))


def test_resume_without_tune_state_fails_before_starting(write_spec, tmp_path: Path) -> None:
    spec = load_spec(write_spec(grid={"method": ["ets"], "ratio": [0.2]}))
    record = _save(spec, tmp_path)  # the sweep record exists, but Tune never wrote its state
    with pytest.raises(ConfigError, match="no Ray Tune state"):
        prepare_sweep(spec, tmp_path, resume=record.sweep_id)


def test_resume_cli_without_an_earlier_sweep(write_spec, tmp_path: Path, capsys) -> None:
    path = write_spec(grid={"method": ["ets"], "ratio": [0.2]})
    rc = sweep_cli.main([str(path), "--output-dir", str(tmp_path / "out"), "--resume"])
    assert rc == sweep_cli.EXIT_BAD_SPEC
    assert "no earlier sweep of spec 'test-sweep'" in capsys.readouterr().out
    assert not ray.is_initialized()


@pytest.mark.slow  # starts an embedded Ray (≈15–25 s here)
def test_a_trial_larger_than_the_embedded_cluster_fails_before_any_trial(write_spec, tmp_path: Path, capsys) -> None:
    path = write_spec(grid={"method": ["ets"], "ratio": [0.2]},
                      base={"preset": str(tmp_path / "test-preset.yaml"),
                            "overrides": {"resources.cpus_per_learner_actor": 64}})
    output = tmp_path / "out"
    assert sweep_cli.main([str(path), "--output-dir", str(output)]) == sweep_cli.EXIT_BAD_SPEC
    message = capsys.readouterr().out
    assert "does not fit the cluster" in message and "resources.cpus_per_rollout_actor" in message
    assert not ray.is_initialized()  # the embedded Ray was shut down again
    assert not (output / "mlflow.db").exists()  # no parent run was opened
