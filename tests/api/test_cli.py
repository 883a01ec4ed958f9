"""The ``gmts`` CLI and the typed client against the app under a real uvicorn server on loopback
(fake Ray Jobs backend, see conftest.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from api.cli import main
from api.client import ApiError, GmtsClient
from tests.api.support import TOKEN, reconcile, sweep_body, write_yaml


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

    run.url = served
    return run


@pytest.mark.slow
def test_sweep_commands(gmts, jobs, served_app, tmp_path: Path) -> None:
    spec = write_yaml(tmp_path / "spec.yaml", sweep_body())
    status, sweep, _ = gmts("sweep", "submit", str(spec), "--idempotency-key", "cli-1", "--json")
    assert status == 0 and sweep["status"] == "pending"
    assert gmts("sweep", "submit", str(spec), "--idempotency-key", "cli-1", "--json")[1]["id"] == sweep["id"]
    jobs.set(sweep["ray_submission_id"], "RUNNING", logs="starting\ntrial 1 done\n")
    reconcile(served_app)
    assert gmts("sweep", "status", sweep["id"], "--json")[1]["status"] == "running"
    assert [item["id"] for item in gmts("sweep", "list", "--json")[1]["items"]] == [sweep["id"]]
    assert gmts("sweep", "logs", sweep["id"], "--tail", "1", "--json")[1]["lines"] == ["trial 1 done"]
    status, cancelled, _ = gmts("sweep", "cancel", sweep["id"], "--json")
    assert status == 0 and cancelled["status"] == "cancelled"
    status, _, err = gmts("sweep", "results", sweep["id"])
    assert status == 1 and "HTTP 409" in err and "was cancelled before it opened its MLflow parent run" in err
    status, resumed, _ = gmts("sweep", "resume", sweep["id"], "--json")
    assert status == 0 and resumed["status"] == "pending" and resumed["ray_submission_id"].endswith("-resume-1")
    status, _, err = gmts("sweep", "resume", sweep["id"])  # it runs again: nothing to resume
    assert status == 1 and "HTTP 409" in err and "only a failed or cancelled sweep resumes" in err


@pytest.mark.slow
def test_a_shipped_spec_by_name(gmts, jobs) -> None:
    status, sweep, err = gmts("sweep", "submit", "cpu-demo", "--json")
    assert status == 0, err
    assert sweep["name"] == "cpu-demo" and sweep["trials"]["total"] == 3


@pytest.mark.slow
def test_the_smoke_spec_is_two_small_trials(gmts, jobs, settings) -> None:
    from sweeps.spec import expand, load_spec

    status, sweep, err = gmts("sweep", "submit", "cpu-smoke", "--json")
    assert status == 0, err
    assert sweep["name"] == "cpu-smoke" and sweep["trials"]["total"] == 2
    trials = expand(load_spec(settings.state_dir / "jobs" / f"{sweep['id']}.yaml"), output_dir=settings.state_dir)
    assert [t.config.training.steps for t in trials] == [2, 2]
    assert all(t.config.data.eval["arithmetic"].limit == 16 for t in trials)


@pytest.mark.slow
def test_run_commands(gmts, jobs, served_app) -> None:
    status, run, err = gmts("run", "submit", "cpu-tiny-s", "--set", "training.steps=1", "--set", "name=cli-run",
                            "--json")
    assert status == 0, err
    assert run["name"] == "cli-run"
    jobs.set(run["ray_submission_id"], "SUCCEEDED")
    reconcile(served_app)
    assert gmts("run", "status", run["id"], "--json")[1]["status"] == "succeeded"
    status, _, err = gmts("run", "submit", "cpu-tiny-s", "--set", "selection.ratio=2.0")
    assert status == 1 and "HTTP 422" in err and "overrides.selection.ratio" in err


@pytest.mark.slow
def test_errors_reach_the_user(gmts, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GMTS_API_TOKEN", "wrong-token-0123456789")
    status, _, err = gmts("sweep", "list")
    assert status == 1 and "HTTP 401" in err and "invalid bearer token" in err
    status, _, err = gmts("sweep", "submit", str(tmp_path / "missing.yaml"))
    assert status == 1 and "neither a file nor a shipped spec" in err


@pytest.mark.slow
def test_typed_client(served: str, served_app, jobs) -> None:
    with GmtsClient(served, TOKEN) as client:
        sweep = client.submit_sweep(sweep_body())
        assert client.sweep(sweep.id).trials.total == 3
        jobs.set(sweep.ray_submission_id, "SUCCEEDED")
        reconcile(served_app)
        assert client.wait(sweep.id, timeout=5, interval=0.1).status == "succeeded"
        assert client.ready().ready is True
        with pytest.raises(ApiError) as error:
            client.sweep("sw-ffffffffffffffff")
        assert error.value.status == 404


@pytest.mark.slow
def test_logs_are_plain_text(gmts, jobs) -> None:
    status, sweep, _ = gmts("sweep", "submit", "cpu-demo", "--json")
    table = "━━━ sweep cpu-demo ━━━\n│ gmts │ 41.2 ± 0.3 │\ndone"
    jobs.set(sweep["ray_submission_id"], "RUNNING", logs=table + "\n")
    status, out, err = gmts("sweep", "logs", sweep["id"])
    assert status == 0 and out == table + "\n" and "\\u2501" not in out and err == ""
    status, out, err = gmts("sweep", "logs", sweep["id"], "--tail", "1")
    assert out == "done\n" and "earlier lines left out" in err


@pytest.mark.slow
def test_submit_takes_set_overrides_of_the_spec(gmts, jobs, served, tmp_path: Path) -> None:
    import yaml

    spec = write_yaml(tmp_path / "spec.yaml", sweep_body())
    status, sweep, err = gmts("sweep", "submit", str(spec), "--set", "base.overrides.training.steps=2",
                              "--set", "max_concurrent_trials=2", "--set", "grid.seed=[0, 1]", "--json")
    assert status == 0, err
    assert sweep["trials"]["total"] == 6  # none, ets, gmts × two seeds
    job_file = jobs.jobs[sweep["ray_submission_id"]]["entrypoint"].split()[4]
    submitted = yaml.safe_load(Path(job_file).read_text())
    assert submitted["base"]["overrides"]["training.steps"] == 2 and submitted["max_concurrent_trials"] == 2
    status, _, err = gmts("sweep", "submit", str(spec), "--set", "name.x=1")
    assert status == 1 and "'name' is a value" in err


@pytest.mark.slow
def test_results_print_the_table_and_json_on_request(gmts, jobs, settings, served_app) -> None:
    from tests.api.test_app import _fake_sweep_runs

    status, sweep, _ = gmts("sweep", "submit", str(write_yaml(settings.state_dir / "s.yaml", sweep_body())), "--json")
    _, parent, _ = _fake_sweep_runs(settings, sweep["id"], "api-test")
    jobs.set(sweep["ray_submission_id"], "RUNNING")
    reconcile(served_app)
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


# --- for people: tables, the newest submission, watch, retries, Ctrl-C --------------------------------------


@pytest.mark.slow
def test_submit_prints_the_id_and_tables_answer_people(gmts, jobs, served_app) -> None:
    status, out, err = gmts("sweep", "submit", "cpu-smoke")
    sweep_id = out.strip()
    assert status == 0 and sweep_id.startswith("sw-") and "\n" not in sweep_id, (out, err)
    assert f"gmts sweep watch {sweep_id}" in err
    jobs.set(f"gmts-{sweep_id}", "RUNNING")
    reconcile(served_app)
    status, table, err = gmts("sweep", "list")
    assert status == 0 and sweep_id in table and "cpu-smoke" in table and "running" in table and "0/2" in table
    assert "{" not in table
    status, table, err = gmts("sweep", "status")  # no id: the newest sweep, named on stderr
    assert status == 0 and f"the newest sweep: {sweep_id}" in err
    assert sweep_id in table and "running (Ray: RUNNING)" in table and "0/2 finished" in table
    assert all(len(line) <= 80 for line in table.splitlines())  # captured output: rich's 80 columns
    status, run_id, _ = gmts("run", "submit", "cpu-smoke")
    status, table, _ = gmts("run", "list")
    assert status == 0 and run_id.strip() in table and "pending" in table
    status, table, err = gmts("run", "status")
    assert status == 0 and run_id.strip() in table and f"the newest run: {run_id.strip()}" in err


@pytest.mark.slow
def test_without_any_sweep_an_id_less_command_says_so(gmts) -> None:
    status, _, err = gmts("sweep", "results")
    assert status == 1 and "no sweep yet: submit one with `gmts sweep submit" in err


@pytest.mark.slow
def test_watch_follows_to_the_end_and_its_exit_status_is_the_outcome(gmts, jobs, served_app) -> None:
    _, first, _ = gmts("sweep", "submit", "cpu-smoke")
    jobs.set(f"gmts-{first.strip()}", "SUCCEEDED")
    reconcile(served_app)
    status, out, err = gmts("sweep", "watch", "--interval", "0.1")
    assert status == 0 and f"{first.strip()} succeeded" in out and f"gmts sweep results {first.strip()}" in out
    _, second, _ = gmts("sweep", "submit", "cpu-smoke")
    jobs.set(f"gmts-{second.strip()}", "FAILED", "entrypoint exited 1")
    reconcile(served_app)
    status, out, err = gmts("sweep", "watch", second.strip(), "--interval", "0.1")
    assert status == 1 and "failed: entrypoint exited 1" in out and f"gmts sweep logs {second.strip()}" in out


@pytest.mark.slow
def test_ctrl_c_while_waiting_says_the_sweep_goes_on(gmts, jobs, monkeypatch) -> None:
    import api.cli

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(api.cli.time, "sleep", interrupted)
    status, out, err = gmts("sweep", "submit", "cpu-smoke", "--wait")
    sweep_id = out.splitlines()[0]
    assert status == 130 and sweep_id.startswith("sw-")  # the id came first
    assert err.splitlines()[-1] == (f"gmts: stopped watching; sweep {sweep_id} goes on (watch it: gmts sweep watch "
                                    f"{sweep_id}; stop it: gmts sweep cancel {sweep_id})")
    assert "Traceback" not in err


@pytest.mark.slow
def test_wait_rides_out_an_api_restart(settings, jobs, monkeypatch, capsys) -> None:
    """The API goes away after the submit and comes back (a new process on the same state): the wait
    retries, then ends with the sweep's outcome."""
    import threading

    from api.app import create_app
    from tests.api.support import free_port, serve

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with serve(create_app(settings, jobs), port):
        sweep = GmtsClient(url, TOKEN).submit_sweep(sweep_body())
    jobs.set(sweep.ray_submission_id, "SUCCEEDED")
    restarted = create_app(settings, jobs)
    stop = threading.Event()

    def come_back() -> None:
        stop.wait(2.0)  # the API is down for these seconds
        with serve(restarted, port):
            reconcile(restarted)
            stop.wait(60)

    thread = threading.Thread(target=come_back, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("GMTS_API_TOKEN", TOKEN)
        status = main(["--url", url, "sweep", "watch", sweep.id, "--interval", "0.1"])
    finally:
        stop.set()
        thread.join(30)
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "cannot reach the gmts API" in err and "retrying for up to" in err and "answers again" in err
    assert f"{sweep.id} succeeded" in out


@pytest.mark.slow
def test_retrying_gives_up_after_its_limit_and_never_retries_a_refusal(served) -> None:
    from api.cli import _retrying
    from api.client import ApiUnreachable
    from tests.api.support import free_port

    naps = []
    with GmtsClient(f"http://127.0.0.1:{free_port()}", TOKEN) as nobody:
        with pytest.raises(ApiUnreachable):
            _retrying(lambda: nobody.sweep("sw-0000000000000000"), 10, sleep=naps.append)
    assert naps == [1.0, 2.0, 4.0, 8.0]  # backoff within the limit: the next nap, 15 s, would pass it
    with GmtsClient(served, TOKEN) as client:
        with pytest.raises(ApiError) as refused:
            _retrying(lambda: client.sweep("sw-ffffffffffffffff"), 10, sleep=naps.append)
    assert refused.value.status == 404 and len(naps) == 4
    assert ApiError(503, "restarting").transient and ApiError(502, "bad gateway").transient
    assert not ApiError(401, "invalid bearer token").transient


@pytest.mark.slow
def test_the_results_header_fits_80_columns(gmts, jobs, settings, served_app) -> None:
    from rich.console import Console

    from api.cli import _print_results
    from tests.api.test_app import _fake_sweep_runs

    _, sweep, _ = gmts("sweep", "submit", str(write_yaml(settings.state_dir / "s.yaml", sweep_body())), "--json")
    _fake_sweep_runs(settings, sweep["id"], "api-test")
    jobs.set(sweep["ray_submission_id"], "RUNNING")
    reconcile(served_app)
    with GmtsClient(gmts.url, TOKEN) as client:
        answer = client.sweep_results(sweep["id"])
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    _print_results(answer, "accuracy", console=console)
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert any(line.startswith(f"Ablation of sweep {sweep['id']} (running)") for line in lines)
    legend = " ".join(line.strip() for line in lines if "95 %" in line or "paired" in line or "validation" in line)
    assert "half-width of the 95 % t interval" in legend  # wrapped between words, not inside one


def test_warnings_go_to_stderr(capsys) -> None:
    from api.cli import _warn
    from api.models import SubmissionList

    _warn(SubmissionList(items=[], warnings=["MLflow at http://127.0.0.1:5000 unreachable"]))
    out, err = capsys.readouterr()
    assert out == "" and err == "gmts: warning: MLflow at http://127.0.0.1:5000 unreachable\n"


# --- clients find the stack of `gmts up` --------------------------------------------------------------------


@pytest.mark.slow
def test_clients_find_the_api_through_stack_json(served, gmts_home, monkeypatch, capsys) -> None:
    gmts_home.mkdir(mode=0o700)
    (gmts_home / "api-token").write_text(TOKEN + "\n")
    stack = {"home": str(gmts_home), "api": {"part": "api", "url": served, "token_file": str(gmts_home / "api-token")}}
    (gmts_home / "stack.json").write_text(json.dumps(stack))
    for name in ("GMTS_API_URL", "GMTS_API_TOKEN", "GMTS_API_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["sweep", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"items": [], "warnings": []}
    assert main(["env"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"export GMTS_API_URL={served}", f"export GMTS_API_TOKEN={TOKEN}"]
    monkeypatch.setenv("GMTS_API_TOKEN", "wrong-token-0123456789")  # the environment comes first
    assert main(["sweep", "list"]) == 1 and "HTTP 401" in capsys.readouterr().err
