"""Sweep records: what ``--resume`` finds, and what it refuses, before anything starts."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import ray

from orchestrator.config_loader import ConfigError
from sweeps import run as sweep_cli
from sweeps.driver import prepare_sweep
from sweeps.layout import SweepLayout, find_record, new_record, save_record
from sweeps.spec import load_spec
from sweeps.storage import SweepStorage
from tests.sweeps.s3_server import environment, object_keys, s3_server

BUCKET = "gmts-layout"


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


@pytest.fixture(scope="module")
def s3_env():
    with s3_server(BUCKET) as env, environment(env):
        yield env


@pytest.mark.slow  # starts a server
def test_records_in_an_object_store_are_what_resume_reads(write_spec, tmp_path: Path, s3_env) -> None:
    """With --storage s3://… the record is written there too, and --resume reads it there alone: the local
    output folder may be gone (the driver's node was lost)."""
    spec = load_spec(write_spec(grid={"method": ["ets"], "ratio": [0.2]}))
    storage = SweepStorage.at(f"s3://{BUCKET}/sweeps")
    assert storage.remote and storage.uri_of("mlartifacts") == f"s3://{BUCKET}/sweeps/mlartifacts"
    first = prepare_sweep(spec, tmp_path / "local-a", storage=storage.uri)
    save_record(first.record, first.layout)
    files = sorted(key for key in object_keys(s3_env, BUCKET) if not key.endswith("/"))  # "/": pyarrow's folders
    assert files == [f"sweeps/{first.record.sweep_id}/{name}" for name in ("spec.yaml", "sweep.json")]
    assert first.layout.tune_dir == f"{BUCKET}/sweeps/ray_results/{first.record.sweep_id}"
    assert first.layout.tune_filesystem is not None
    # Another machine, an empty output folder: the newest sweep of the spec, or the one named, from the store.
    elsewhere = tmp_path / "local-b"
    assert find_record(elsewhere, spec, storage=storage).sweep_id == first.record.sweep_id
    assert find_record(elsewhere, spec, first.record.sweep_id, storage).spec_hash == spec.spec_hash()
    # A new sweep's id is checked against the store too, not only the local folder.
    with pytest.raises(ConfigError, match="exists"):
        prepare_sweep(spec, elsewhere, sweep_id=first.record.sweep_id, storage=storage.uri)
    with pytest.raises(ConfigError, match="no sweep 'nope'"):
        find_record(elsewhere, spec, "nope", storage)
    with pytest.raises(ConfigError, match="no Ray Tune state"):  # a record alone is not a resumable sweep
        prepare_sweep(spec, elsewhere, resume=True, storage=storage.uri)


def test_a_storage_that_is_no_folder_nor_uri_is_refused() -> None:
    with pytest.raises(ConfigError, match="--storage: 'nosuch://x'"):
        SweepStorage.at("nosuch://x")


def test_a_folder_storage_is_the_output_dir_layout(tmp_path: Path) -> None:
    """The default: the layout of every sweep so far (Tune opens the folder itself)."""
    layout = SweepLayout(tmp_path, "s1")
    assert not layout.durable.remote and layout.tune_filesystem is None
    assert layout.tune_dir == str(tmp_path.resolve() / "ray_results" / "s1")
    assert layout.durable.uri_of("mlartifacts") == (tmp_path.resolve() / "mlartifacts").as_uri()
