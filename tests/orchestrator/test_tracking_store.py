"""A run started with ``ray job submit --working-dir .`` and no tracking URI must not log silently into
Ray's temporary working-dir copy: it refuses, naming MLFLOW_TRACKING_URI and the field.

Ray's copy is imitated by a folder of the same shape (``…/runtime_resources/working_dir_files/
_ray_pkg_<hash>/``) that the job's working directory is: what the code looks at is the path alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import train as train_cli
from orchestrator.config import UnfindableStore, ray_working_dir_copy
from orchestrator.config_loader import load_experiment
from sweeps import run as sweep_cli


@pytest.fixture
def ray_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The job's working directory as Ray unpacks it, as the current directory; no MLFLOW_TRACKING_URI."""
    copy = tmp_path / "ray" / "session_2026-12-01_13-00-00_1_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0a1b2c"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return copy


def test_the_copy_is_recognised_by_its_path(tmp_path: Path) -> None:
    copy = tmp_path / "session_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"
    assert ray_working_dir_copy(copy / "runs" / "mlflow.db") == copy
    assert ray_working_dir_copy(tmp_path / "runs" / "mlflow.db") is None
    assert ray_working_dir_copy(tmp_path / "working_dir_files" / "runtime_resources" / "x") is None  # order matters


def test_the_default_store_in_the_copy_is_refused_naming_what_to_set(ray_copy: Path, monkeypatch) -> None:
    config = load_experiment("cpu-tiny-s")  # output_dir: runs (relative → inside the copy)
    with pytest.raises(UnfindableStore) as refused:
        config.tracking_uri()
    message = str(refused.value)
    assert message.startswith("tracking.tracking_uri: not set, and MLFLOW_TRACKING_URI is not set either")
    assert str(ray_copy / "runs" / "mlflow.db") in message and "absolute output_dir" in message
    # any of the three ways out is accepted
    assert load_experiment("cpu-tiny-s", ["tracking.tracking_uri=http://127.0.0.1:5000"]).tracking_uri() == "http://127.0.0.1:5000"
    outside = ray_copy.parents[4] / "kept"
    assert load_experiment("cpu-tiny-s", [f"output_dir={outside}"]).tracking_uri() == f"sqlite:///{outside / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5001")
    assert config.tracking_uri() == "http://127.0.0.1:5001"


def test_orchestrator_train_refuses_before_starting_anything(ray_copy: Path, capsys) -> None:
    assert train_cli.main(["--config", "cpu-tiny-s", "--set", "training.steps=1"]) == 2
    err = capsys.readouterr().err
    assert "MLFLOW_TRACKING_URI" in err and "temporary copy of the job's working directory" in err
    assert not (ray_copy / "runs").exists()  # no store, no run folder was created


def test_sweeps_run_refuses_too(ray_copy: Path, capsys) -> None:
    assert sweep_cli.main(["cpu-smoke"]) == sweep_cli.EXIT_BAD_SPEC
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "tracking_uri: not set, and MLFLOW_TRACKING_URI is not set either" in out
    assert "absolute --output-dir outside that copy" in out
