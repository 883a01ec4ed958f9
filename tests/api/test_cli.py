"""The ``gmts`` CLI and the typed client against the app under a real uvicorn server on loopback
(fake Ray Jobs backend, see conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.cli import main
from api.client import ApiError, GmtsClient
from tests.api.support import TOKEN, sweep_body, write_yaml


@pytest.fixture
def gmts(served: str, monkeypatch, capsys):
    """Run ``gmts ARGS…``; returns (exit status, parsed JSON stdout or None, stderr)."""
    monkeypatch.setenv("GMTS_API_URL", served)
    monkeypatch.setenv("GMTS_API_TOKEN", TOKEN)

    def run(*args: str):
        status = main(list(args))
        out, err = capsys.readouterr()
        return status, (json.loads(out) if out.strip() else None), err

    return run


def test_sweep_commands(gmts, jobs, tmp_path: Path) -> None:
    spec = write_yaml(tmp_path / "spec.yaml", sweep_body())
    status, sweep, _ = gmts("sweep", "submit", str(spec), "--idempotency-key", "cli-1")
    assert status == 0 and sweep["status"] == "pending"
    assert gmts("sweep", "submit", str(spec), "--idempotency-key", "cli-1")[1]["id"] == sweep["id"]
    jobs.set(sweep["ray_submission_id"], "RUNNING", logs="starting\ntrial 1 done\n")
    assert gmts("sweep", "status", sweep["id"])[1]["status"] == "running"
    assert [item["id"] for item in gmts("sweep", "list")[1]["items"]] == [sweep["id"]]
    assert gmts("sweep", "logs", sweep["id"], "--tail", "1")[1]["lines"] == ["trial 1 done"]
    status, cancelled, _ = gmts("sweep", "cancel", sweep["id"])
    assert status == 0 and cancelled["status"] == "cancelled"
    status, _, err = gmts("sweep", "results", sweep["id"])
    assert status == 1 and "HTTP 409" in err and "was cancelled before it opened its MLflow parent run" in err


def test_a_shipped_spec_by_name(gmts, jobs) -> None:
    status, sweep, err = gmts("sweep", "submit", "cpu-demo")
    assert status == 0, err
    assert sweep["name"] == "cpu-demo" and sweep["trials"]["total"] == 3


def test_run_commands(gmts, jobs) -> None:
    status, run, err = gmts("run", "submit", "cpu-tiny-s", "--set", "training.steps=1", "--set", "name=cli-run")
    assert status == 0, err
    assert run["name"] == "cli-run"
    jobs.set(run["ray_submission_id"], "SUCCEEDED")
    assert gmts("run", "status", run["id"])[1]["status"] == "succeeded"
    status, _, err = gmts("run", "submit", "cpu-tiny-s", "--set", "selection.ratio=2.0")
    assert status == 1 and "HTTP 422" in err and "overrides.selection.ratio" in err


def test_errors_reach_the_user(gmts, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GMTS_API_TOKEN", "wrong-token-0123456789")
    status, _, err = gmts("sweep", "list")
    assert status == 1 and "HTTP 401" in err and "invalid bearer token" in err
    status, _, err = gmts("sweep", "submit", str(tmp_path / "missing.yaml"))
    assert status == 1 and "neither a file nor a shipped spec" in err


def test_typed_client(served: str, jobs) -> None:
    with GmtsClient(served, TOKEN) as client:
        sweep = client.submit_sweep(sweep_body())
        assert client.sweep(sweep.id).trials.total == 3
        jobs.set(sweep.ray_submission_id, "SUCCEEDED")
        assert client.wait(sweep.id, timeout=5, interval=0.1).status == "succeeded"
        assert client.ready().ready is True
        with pytest.raises(ApiError) as error:
            client.sweep("sw-ffffffffffffffff")
        assert error.value.status == 404
