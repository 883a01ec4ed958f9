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
    """Run ``gmts ARGS…``; returns (exit status, stdout parsed as JSON — or the text if it is not JSON —
    or None, stderr)."""
    monkeypatch.setenv("GMTS_API_URL", served)
    monkeypatch.setenv("GMTS_API_TOKEN", TOKEN)

    def run(*args: str):
        status = main(list(args))
        out, err = capsys.readouterr()
        try:
            return status, (json.loads(out) if out.strip() else None), err
        except ValueError:
            return status, out, err

    return run


def test_sweep_commands(gmts, jobs, tmp_path: Path) -> None:
    spec = write_yaml(tmp_path / "spec.yaml", sweep_body())
    status, sweep, _ = gmts("sweep", "submit", str(spec), "--idempotency-key", "cli-1")
    assert status == 0 and sweep["status"] == "pending"
    assert gmts("sweep", "submit", str(spec), "--idempotency-key", "cli-1")[1]["id"] == sweep["id"]
    jobs.set(sweep["ray_submission_id"], "RUNNING", logs="starting\ntrial 1 done\n")
    assert gmts("sweep", "status", sweep["id"])[1]["status"] == "running"
    assert [item["id"] for item in gmts("sweep", "list")[1]["items"]] == [sweep["id"]]
    assert gmts("sweep", "logs", sweep["id"], "--tail", "1", "--json")[1]["lines"] == ["trial 1 done"]
    status, cancelled, _ = gmts("sweep", "cancel", sweep["id"])
    assert status == 0 and cancelled["status"] == "cancelled"
    status, _, err = gmts("sweep", "results", sweep["id"])
    assert status == 1 and "HTTP 409" in err and "was cancelled before it opened its MLflow parent run" in err


def test_a_shipped_spec_by_name(gmts, jobs) -> None:
    status, sweep, err = gmts("sweep", "submit", "cpu-demo")
    assert status == 0, err
    assert sweep["name"] == "cpu-demo" and sweep["trials"]["total"] == 3


def test_the_smoke_spec_is_two_small_trials(gmts, jobs, settings) -> None:
    from sweeps.spec import expand, load_spec

    status, sweep, err = gmts("sweep", "submit", "cpu-smoke")
    assert status == 0, err
    assert sweep["name"] == "cpu-smoke" and sweep["trials"]["total"] == 2
    trials = expand(load_spec(settings.state_dir / "jobs" / f"{sweep['id']}.yaml"), output_dir=settings.state_dir)
    assert [t.config.training.steps for t in trials] == [2, 2]
    assert all(t.config.data.eval["arithmetic"].limit == 16 for t in trials)


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


def test_logs_are_plain_text(gmts, jobs) -> None:
    status, sweep, _ = gmts("sweep", "submit", "cpu-demo")
    table = "━━━ sweep cpu-demo ━━━\n│ gmts │ 41.2 ± 0.3 │\ndone"
    jobs.set(sweep["ray_submission_id"], "RUNNING", logs=table + "\n")
    status, out, err = gmts("sweep", "logs", sweep["id"])
    assert status == 0 and out == table + "\n" and "\\u2501" not in out and err == ""
    status, out, err = gmts("sweep", "logs", sweep["id"], "--tail", "1")
    assert out == "done\n" and "earlier lines left out" in err


def test_submit_takes_set_overrides_of_the_spec(gmts, jobs, served, tmp_path: Path) -> None:
    import yaml

    spec = write_yaml(tmp_path / "spec.yaml", sweep_body())
    status, sweep, err = gmts("sweep", "submit", str(spec), "--set", "base.overrides.training.steps=2",
                              "--set", "max_concurrent_trials=2", "--set", "grid.seed=[0, 1]")
    assert status == 0, err
    assert sweep["trials"]["total"] == 6  # none, ets, gmts × two seeds
    job_file = jobs.jobs[sweep["ray_submission_id"]]["entrypoint"].split()[4]
    submitted = yaml.safe_load(Path(job_file).read_text())
    assert submitted["base"]["overrides"]["training.steps"] == 2 and submitted["max_concurrent_trials"] == 2
    status, _, err = gmts("sweep", "submit", str(spec), "--set", "name.x=1")
    assert status == 1 and "'name' is a value" in err


def test_results_print_the_table_and_json_on_request(gmts, jobs, settings) -> None:
    from tests.api.test_app import _fake_sweep_runs

    status, sweep, _ = gmts("sweep", "submit", str(write_yaml(settings.state_dir / "s.yaml", sweep_body())))
    _, parent, _ = _fake_sweep_runs(settings, sweep["id"], "api-test")
    jobs.set(sweep["ray_submission_id"], "RUNNING")
    status, out, err = gmts("sweep", "results", sweep["id"])
    assert status == 0, err
    assert isinstance(out, str) and "PARTIAL: the sweep is still running" in out
    assert f"MLflow parent run: {parent}" in out and "{" not in out  # for people: no JSON
    status, answer, _ = gmts("sweep", "results", sweep["id"], "--json")
    assert answer["parent_run_id"] == parent and answer["complete"] is False and "cells" in answer["results"]


def test_no_token_or_no_service_says_what_to_do_never_http_0(gmts, monkeypatch) -> None:
    from tests.api.support import free_port

    monkeypatch.delenv("GMTS_API_TOKEN")
    monkeypatch.delenv("GMTS_API_TOKEN_FILE", raising=False)
    status, _, err = gmts("sweep", "list")
    assert status == 1 and "no API token: set GMTS_API_TOKEN" in err and "HTTP" not in err
    monkeypatch.setenv("GMTS_API_TOKEN", TOKEN)
    monkeypatch.setenv("GMTS_API_URL", f"http://127.0.0.1:{free_port()}")
    status, _, err = gmts("sweep", "list")
    assert status == 1 and "cannot reach the gmts API at http://127.0.0.1:" in err and "gmts serve" in err
    assert "HTTP 0" not in err
