"""The REST API on the real app (SQLite records, MLflow SQLite store, full validation) with a fake Ray
Jobs backend (see conftest.py): auth, validation errors, size limit, path confinement, idempotency,
status reconciliation, cancel, logs, results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from api.app import create_app
from api.ray_jobs import RayJobs
from api.service import SUBMIT_GRACE_S, ControlPlane
from api.settings import ApiSettings
from api.tracking_view import API_ID_TAG, TrackingView
from orchestrator.config_loader import load_experiment
from sweeps.parent_run import PARENT_TAG, SPEC_NAME_TAG, SWEEP_ID_TAG, TRIAL_TAG
from sweeps.report import ablation_results
from sweeps.spec import expand, load_spec
from tests.api.support import TOKEN, FakeJobs, bearer, reconcile, sweep_body, wait_for, write_yaml

V1_CALLS = [
    ("POST", "/v1/sweeps"),
    ("GET", "/v1/sweeps"),
    ("GET", "/v1/sweeps/sw-0123456789abcdef"),
    ("GET", "/v1/sweeps/sw-0123456789abcdef/results"),
    ("GET", "/v1/sweeps/sw-0123456789abcdef/logs"),
    ("POST", "/v1/sweeps/sw-0123456789abcdef/cancel"),
    ("POST", "/v1/sweeps/sw-0123456789abcdef/resume"),
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs"),
    ("GET", "/v1/runs/run-0123456789abcdef"),
    ("GET", "/v1/runs/run-0123456789abcdef/logs"),
    ("POST", "/v1/runs/run-0123456789abcdef/cancel"),
]


def _submit(client: TestClient, body: dict | None = None, **headers: str) -> dict:
    response = client.post("/v1/sweeps", json=body or sweep_body(), headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


# -- auth -----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path"), V1_CALLS)
@pytest.mark.parametrize(
    ("headers", "says"),
    [({}, "missing bearer token"), (bearer("wrong-token-0123456789"), "invalid bearer token"),
     ({"Authorization": f"Basic {TOKEN}"}, "missing bearer token"), (bearer(TOKEN + "x"), "invalid bearer token")],
    ids=["none", "wrong", "basic-scheme", "longer"],
)
def test_every_v1_endpoint_needs_the_token(settings, jobs, method, path, headers, says) -> None:
    with TestClient(create_app(settings, jobs)) as anonymous:
        response = anonymous.request(method, path, headers=headers, json=sweep_body() if method == "POST" else None)
    assert response.status_code == 401
    assert says in response.json()["message"]
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert not jobs.jobs


def test_health_needs_no_token_and_readiness_checks_ray_and_mlflow(settings, jobs) -> None:
    with TestClient(create_app(settings, jobs)) as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        assert anonymous.get("/readyz").json() == {"ready": True, "ray": "ok", "mlflow": "ok"}
        jobs.available = False
        response = anonymous.get("/readyz")
    assert response.status_code == 503
    assert response.json()["ray"].startswith("unreachable")


class _RefusingHandler(BaseHTTPRequestHandler):
    """Answers every request as a token-auth Ray dashboard does: 401 without a token, 403 with a wrong one."""

    def do_GET(self) -> None:
        status = 403 if self.headers.get("Authorization") else 401
        body = b"Forbidden: Invalid authentication token" if status == 403 else b"Unauthorized: Missing authentication token"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
@pytest.mark.parametrize(("token", "says"), [("wrong-token", "rejected the token"), (None, "wants a token and got none")])
def test_readiness_tells_a_refused_token_from_an_unreachable_ray(settings, monkeypatch, tmp_path, token, says) -> None:
    """The real Ray Jobs client against a loopback server that answers like a token-auth Ray head refusing
    us (401/403). A stand-in, because the one real token-auth head of the suite is the slow integration
    test's (it checks the same there); starting another costs ~10 s and 0.6 GB per run of this test."""
    # Else Ray's client adds a token of its own: from the environment, or from ~/.ray/auth_token where the
    # machine's user keeps one.
    for variable in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        jobs = RayJobs(f"http://127.0.0.1:{server.server_address[1]}", token)
        with TestClient(create_app(settings, jobs)) as anonymous:
            response = anonymous.get("/readyz")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert response.status_code == 503
    assert response.json()["ray"].startswith("refused: ") and says in response.json()["ray"], response.json()
    assert "GMTS_RAY_AUTH_TOKEN" in response.json()["ray"] and response.json()["mlflow"] == "ok"
    unreachable = RayJobs(f"http://127.0.0.1:{server.server_address[1]}", token)  # the server is gone now
    with TestClient(create_app(settings, unreachable)) as anonymous:
        assert anonymous.get("/readyz").json()["ray"].startswith("unreachable")


def test_the_service_refuses_to_start_without_a_usable_token(tmp_path: Path, monkeypatch, settings) -> None:
    from api.settings import SettingsError

    for name in ("GMTS_API_TOKEN", "GMTS_API_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GMTS_MLFLOW_TRACKING_URI", settings.tracking_uri())
    with pytest.raises(SettingsError, match="GMTS_API_TOKEN"):
        create_app(ApiSettings(state_dir=tmp_path), FakeJobs())
    with pytest.raises(SettingsError, match="at least 16"):
        create_app(ApiSettings(state_dir=tmp_path, api_token="short"), FakeJobs())
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("GMTS_API_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("GMTS_STATE_DIR", str(tmp_path / "state"))
    with TestClient(create_app(ApiSettings(), FakeJobs()), headers=bearer()) as client:
        assert client.get("/v1/sweeps").status_code == 200


def test_settings_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GMTS_STATE_DIR", str(tmp_path / "s"))
    monkeypatch.setenv("GMTS_ALLOWED_ROOTS", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    monkeypatch.setenv("GMTS_MAX_BODY_BYTES", "4096")
    settings = ApiSettings()
    assert settings.host == "127.0.0.1"  # loopback unless told otherwise
    assert settings.allowed_roots == [tmp_path / "a", tmp_path / "b", tmp_path / "s"]
    assert settings.max_body_bytes == 4096
    monkeypatch.setenv("GMTS_ALLOWED_ROOTS", json.dumps([str(tmp_path / "c")]))
    assert ApiSettings().allowed_roots == [tmp_path / "c", tmp_path / "s"]
    monkeypatch.setenv("GMTS_ALLOWED_ROOTS", "/")
    with pytest.raises(ValueError, match="filesystem root"):
        ApiSettings()


# -- submitting -----------------------------------------------------------------------------------


def test_submit_writes_a_validated_spec_and_a_constant_entrypoint(client, jobs, settings) -> None:
    sweep = _submit(client)
    assert sweep["status"] == "pending" and sweep["trials"]["total"] == 3
    assert sweep["links"]["results"] == f"/v1/sweeps/{sweep['id']}/results"
    job = jobs.jobs[sweep["ray_submission_id"]]
    job_file = settings.state_dir / "jobs" / f"{sweep['id']}.yaml"
    run_dir = settings.state_dir / "runs" / sweep["id"]
    assert job["entrypoint"] == f"python -m api.job sweep {job_file} --output-dir {run_dir}"
    assert job["env_vars"]["MLFLOW_TRACKING_URI"] == settings.tracking_uri()
    assert TOKEN not in json.dumps(job)  # no secret in the runtime_env, which Ray shows to anyone
    spec = load_spec(job_file)  # the file the job runs is a valid spec that sweeps.run accepts
    assert spec.tracking_uri == settings.tracking_uri()
    trials = expand(spec, output_dir=run_dir)
    assert [t.config.tracking.tags[API_ID_TAG] for t in trials] == [sweep["id"]] * 3
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "pending"


def test_status_follows_ray(client, jobs) -> None:
    sweep = _submit(client)
    sid = sweep["ray_submission_id"]
    jobs.set(sid, "RUNNING")
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "pending"  # until the reconciler's next pass
    reconcile(client)
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "running"
    jobs.set(sid, "SUCCEEDED", "Job finished successfully.")
    reconcile(client)
    body = client.get(f"/v1/sweeps/{sweep['id']}").json()
    assert (body["status"], body["ray_status"], body["message"]) == ("succeeded", "SUCCEEDED", "Job finished successfully.")
    jobs.set(sid, "FAILED")  # a finished record is final: Ray is not asked again
    reconcile(client)
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "succeeded"
    listed = client.get("/v1/sweeps", params={"status": "succeeded"}).json()["items"]
    assert [item["id"] for item in listed] == [sweep["id"]]


def test_submit_a_single_run(client, jobs, settings) -> None:
    response = client.post("/v1/runs", json={"preset": "cpu-tiny-s", "overrides": {"training.steps": 1, "name": "one-run"}})
    assert response.status_code == 201, response.text
    run = response.json()
    assert run["id"].startswith("run-") and run["name"] == "one-run" and run["links"]["results"] is None
    job_file = settings.state_dir / "jobs" / f"{run['id']}.yaml"
    assert jobs.jobs[run["ray_submission_id"]]["entrypoint"] == f"python -m api.job run {job_file}"
    config = load_experiment(job_file)  # the complete validated config, as orchestrator.train loads it
    assert config.training.steps == 1
    assert config.output_dir == settings.state_dir / "runs" / run["id"]
    assert config.tracking.tracking_uri == settings.tracking_uri()
    assert config.tracking.tags[API_ID_TAG] == run["id"]
    assert client.get(f"/v1/runs/{run['id']}").json()["id"] == run["id"]
    assert [r["id"] for r in client.get("/v1/runs").json()["items"]] == [run["id"]]
    assert client.get(f"/v1/sweeps/{run['id']}").status_code == 422  # a run id is not a sweep id


def test_a_preset_file_under_the_roots_and_its_extends_chain(client, roots: Path, tmp_path: Path) -> None:
    inside = write_yaml(roots / "mine.yaml", {"extends": "cpu-tiny-s", "training": {"steps": 1}})
    assert client.post("/v1/sweeps", json=sweep_body(base={"preset": str(inside)})).status_code == 201
    outside = write_yaml(tmp_path / "outside.yaml", {"extends": "cpu-tiny-s"})
    chained = write_yaml(roots / "chained.yaml", {"extends": str(outside)})
    for preset, says in [(str(outside), "outside the allowed roots"), (str(chained), "outside the allowed roots"),
                         ("/etc/passwd", "outside the allowed roots"), ("no-such-preset", "unknown preset")]:
        response = client.post("/v1/sweeps", json=sweep_body(base={"preset": preset}))
        assert response.status_code == 422, preset
        assert "base.preset" in response.json()["message"] and says in response.json()["message"]
        assert "root:" not in response.text  # nothing of /etc/passwd leaks


# -- bad inputs: the right 4xx, naming the problem --------------------------------------------------


def _bad(client: TestClient, body, expected_status: int, *fragments: str, path: str = "/v1/sweeps", **kwargs) -> None:
    if isinstance(body, (bytes, str)):
        response = client.post(path, content=body, headers={"Content-Type": "application/json"}, **kwargs)
    else:
        response = client.post(path, json=body, **kwargs)
    assert response.status_code == expected_status, response.text
    message = response.json()["message"]
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_malformed_json(client) -> None:
    _bad(client, b'{"name": "x", "base": ', 400, "malformed JSON")


def test_wrong_types(client) -> None:
    _bad(client, sweep_body(max_concurrent_trials="many"), 422, "body.max_concurrent_trials", "integer")
    _bad(client, sweep_body(grid={"method": "gmts"}), 422, "body.grid.method", "list")
    _bad(client, {"preset": 7}, 422, "body.preset", "string", path="/v1/runs")
    _bad(client, [1, 2], 422, "body")


def test_ratio_out_of_range(client) -> None:
    _bad(client, sweep_body(grid={"method": ["gmts"], "ratio": [0.2, 2.0]}), 422, "body.grid.ratio", "ratio[1]=2.0")
    _bad(client, {"preset": "cpu-tiny-s", "overrides": {"selection.ratio": 2.0}}, 422,
         "overrides.selection.ratio", "less than or equal to 1", path="/v1/runs")


def test_old_scope_name_is_refused_naming_the_new_ones(client) -> None:
    _bad(client, sweep_body(grid={"method": ["ets"], "scope": ["batch"]}), 422, "body.grid.scope")
    _bad(client, {"preset": "cpu-tiny-s", "overrides": {"selection.recipe": None, "selection.scope": "batch"}}, 422,
         "overrides.selection.scope", "'batch' was renamed", "micro_batch", path="/v1/runs")


def test_unknown_fields_are_rejected_by_name(client) -> None:
    _bad(client, sweep_body(colour="blue"), 422, "body.colour", "Extra inputs are not permitted")
    _bad(client, sweep_body(base={"preset": "cpu-tiny-s", "overides": {}}), 422, "body.base.overides")
    _bad(client, sweep_body(grid={"methods": ["gmts"]}), 422, "body.grid.methods")
    _bad(client, sweep_body(base={"preset": "cpu-tiny-s", "overrides": {"training.stepz": 1}}), 422, "training.stepz")
    _bad(client, {"preset": "cpu-tiny-s", "overrides": {"model.colour": 1}}, 422, "overrides.model.colour",
         path="/v1/runs")


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["it's", "a$(id)", "two\nlines", "a/b", " gmts", ""])
def test_an_experiment_name_is_held_to_the_name_pattern(client, jobs, experiment: str) -> None:
    """The experiment reaches MLflow filters, folder names and URLs like ``name`` does: same pattern,
    for a sweep's ``experiment`` and a run's ``tracking.experiment`` (also inside a sweep's base)."""
    _bad(client, sweep_body(experiment=experiment), 422, "body.experiment: String should match pattern")
    _bad(client, {"preset": "cpu-tiny-s", "overrides": {"tracking.experiment": experiment}}, 422,
         "overrides.tracking.experiment: String should match pattern", path="/v1/runs")
    nested = {"preset": "cpu-tiny-s", "overrides": {"tracking": {"experiment": experiment}}}
    _bad(client, nested, 422, "overrides.tracking.experiment", path="/v1/runs")
    assert not jobs.jobs
    accepted = client.post("/v1/runs", json={"preset": "cpu-tiny-s", "overrides": {"tracking.experiment": "ablation_2.1-b"}})
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["mlflow"]["experiment"] == "ablation_2.1-b"


def _raw(client: TestClient, body: str, path: str = "/v1/sweeps"):
    """JSON as an attacker types it: ``Infinity``/``NaN`` literals, which Python's json parser accepts."""
    return client.post(path, content=body, headers={"Content-Type": "application/json"})


@pytest.mark.slow
@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_non_finite_numbers_are_refused_naming_the_field(client, jobs, literal: str) -> None:
    sweep = ('{"name": "x", "base": {"preset": "cpu-tiny-s", "overrides": {"learner.lr": %s}}, '
             '"grid": {"method": ["gmts"]}}' % literal)
    response = _raw(client, sweep)
    assert response.status_code == 422, response.text
    assert "base.overrides.learner.lr: must be a finite number" in response.json()["message"]
    assert response.json()["detail"][0]["loc"] == ["body", "base.overrides.learner.lr"]
    response = _raw(client, '{"preset": "cpu-tiny-s", "overrides": {"rollout.temperature": %s}}' % literal, "/v1/runs")
    assert response.status_code == 422, response.text
    assert "overrides.rollout.temperature: must be a finite number" in response.json()["message"]
    assert jobs.jobs == {}  # nothing reached Ray


def test_a_non_finite_number_in_a_preset_file_is_refused_too(client, jobs, roots: Path) -> None:
    preset = write_yaml(roots / "inf.yaml", {"extends": "cpu-tiny-s", "learner": {"lr": float("inf")}})
    _bad(client, sweep_body(base={"preset": str(preset)}, grid={"method": ["gmts"]}), 422,
         "trial 0 (api-test-t000).learner.lr: must be a finite number")
    _bad(client, {"preset": str(preset)}, 422, "config.learner.lr: must be a finite number", path="/v1/runs")
    assert jobs.jobs == {}


def test_absurd_numbers_are_refused_naming_the_field_and_the_bound(client, jobs) -> None:
    def overrides(**values):
        return sweep_body(base={"preset": "cpu-tiny-s", "overrides": values}, grid={"method": ["gmts"]})

    _bad(client, overrides(**{"training.steps": 1e18}), 422, "base.overrides.training.steps", "upper bound 1000000")
    _bad(client, sweep_body(grid={"method": ["gmts"], "seed": [0, 2**40]}), 422, "grid.seed.1", "upper bound 4294967295")
    _bad(client, sweep_body(grid={"method": ["gmts"], "seed": [0, 1e30]}), 422, "grid.seed.1")  # pydantic's own refusal
    _bad(client, sweep_body(max_concurrent_trials=1e30), 422, "max_concurrent_trials")
    _bad(client, sweep_body(max_concurrent_trials=5000), 422, "max_concurrent_trials", "upper bound 1024")
    _bad(client, overrides(**{"training.seed": -1}), 422, "base.overrides.training.seed", "must not be negative")
    _bad(client, overrides(**{"rollout.max_new_tokens": 10**9}), 422, "rollout.max_new_tokens", "upper bound 1048576")
    _bad(client, overrides(**{"learner.mini_batch_size": 10**12}), 422, "learner.mini_batch_size", "upper bound 10000000")
    _bad(client, sweep_body(grid={"method": ["gmts"], "ratio": [0.1] * 20, "seed": list(range(60))}), 422,
         "grid", "expands to up to 1200 trials", "at most 1000")
    _bad(client, {"preset": "cpu-tiny-s", "overrides": {"training.steps": 1e18}}, 422, "overrides.training.steps",
         "upper bound", path="/v1/runs")
    assert jobs.jobs == {}
    # The bound itself is allowed (the bounds are limits, not a second opinion on a sensible run).
    assert client.post("/v1/sweeps", json=overrides(**{"training.steps": 1_000_000, "training.seed": 2**32 - 1})).status_code == 201


def test_the_job_revalidates_its_file_before_it_starts(client, settings, capsys) -> None:
    from api.job import main as job_main, validate

    sweep = _submit(client)
    job_file = settings.state_dir / "jobs" / f"{sweep['id']}.yaml"
    validate("sweep", job_file, settings.state_dir / "runs" / sweep["id"])  # the file as written passes
    tampered = yaml.safe_load(job_file.read_text())
    tampered["base"]["overrides"]["learner.lr"] = float("inf")
    tampered["max_concurrent_trials"] = 10**9
    job_file.write_text(yaml.safe_dump(tampered))
    assert job_main(["sweep", str(job_file), "--output-dir", str(settings.state_dir / "runs" / sweep["id"])]) == 2
    err = capsys.readouterr().err
    assert "base.overrides.learner.lr: must be a finite number" in err and "max_concurrent_trials" in err
    run = client.post("/v1/runs", json={"preset": "cpu-tiny-s", "overrides": {"training.steps": 1}}).json()
    run_file = settings.state_dir / "jobs" / f"{run['id']}.yaml"
    validate("run", run_file, None)
    config = yaml.safe_load(run_file.read_text())
    config["training"]["steps"] = 10**12
    run_file.write_text(yaml.safe_dump(config))
    assert job_main(["run", str(run_file)]) == 2
    assert "config.training.steps" in capsys.readouterr().err


def test_config_errors_name_the_trial_and_field(client) -> None:
    _bad(client, sweep_body(grid={"method": ["gmts"]}, base={"preset": "cpu-tiny-s", "overrides": {"selection.ratio": None}}),
         422, "trial 0 (method=gmts)", "ratio")


def test_paths_outside_the_roots(client, roots: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    (outside / "model").mkdir(parents=True)
    (outside / "model" / "config.json").write_text("{}")
    (outside / "train.jsonl").write_text("")
    (roots / "escape").symlink_to(outside)  # a symlink under the roots that leads out of them
    cases = {
        "model.path": [str(outside / "model"), f"{roots}/../elsewhere/model", str(roots / "escape" / "model"), "model"],
        "data.train.source": [str(outside / "train.jsonl"), str(roots / "escape" / "train.jsonl")],
        "model.cache_dir": ["/var/tmp/models"],
    }
    for key, values in cases.items():
        for value in values:
            overrides = {"model.source": "hf", key: value} if key == "model.path" else {key: value}
            response = client.post("/v1/sweeps", json=sweep_body(base={"preset": "cpu-tiny-s", "overrides": overrides}))
            assert response.status_code == 422, (key, value, response.text)
            message = response.json()["message"]
            assert f"base.overrides.{key}" in message, message
            assert any(s in message for s in ("outside the allowed roots", "'..'", "absolute path")), message
    _bad(client, {"preset": "cpu-tiny-s", "overrides": {"data": {"eval": {"x": {"source": "/etc/x.jsonl"}}}}}, 422,
         "overrides.data.eval.x.source", "outside the allowed roots", path="/v1/runs")
    _bad(client, sweep_body(tracking_uri="sqlite:////tmp/elsewhere.db"), 422, "tracking_uri", "set by the server")


def test_a_data_file_under_the_roots_is_accepted(client, roots: Path) -> None:
    data = roots / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2", "domain": "arithmetic"}) + "\n")
    response = client.post("/v1/runs", json={"preset": "cpu-tiny-s", "overrides": {"data.train": {"source": str(data)}}})
    assert response.status_code == 201, response.text


@pytest.mark.slow
def test_oversize_bodies(client, settings) -> None:
    big = sweep_body(description="x" * settings.max_body_bytes)
    _bad(client, big, 413, "limit is 8192 bytes")

    def chunks():  # no Content-Length: the limit applies while reading
        yield b'{"name": "chunked", "description": "'
        for _ in range(20):
            yield b"y" * 1024
        yield b'"}'

    response = client.post("/v1/sweeps", content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert "larger than 8192 bytes" in response.json()["message"]


# -- idempotency ----------------------------------------------------------------------------------


def test_the_same_idempotency_key_creates_one_sweep(client, jobs) -> None:
    first = client.post("/v1/sweeps", json=sweep_body(), headers={"Idempotency-Key": "k-1"})
    second = client.post("/v1/sweeps", json=sweep_body(), headers={"Idempotency-Key": "k-1"})
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert len(jobs.jobs) == 1
    other = client.post("/v1/sweeps", json=sweep_body(description="changed"), headers={"Idempotency-Key": "k-1"})
    assert other.status_code == 422 and "Idempotency-Key 'k-1'" in other.json()["message"]
    assert client.post("/v1/sweeps", json=sweep_body()).json()["id"] != first.json()["id"]  # no key: a new sweep
    assert len(jobs.jobs) == 2
    bad_key = client.post("/v1/sweeps", json=sweep_body(), headers={"Idempotency-Key": "has space"})
    assert bad_key.status_code == 422 and "Idempotency-Key" in bad_key.json()["message"]


@pytest.mark.slow
def test_concurrent_posts_with_one_key_create_one_sweep(served: str, jobs) -> None:
    def post(_):
        return httpx.post(f"{served}/v1/sweeps", json=sweep_body(), headers={**bearer(), "Idempotency-Key": "race"},
                          timeout=60)

    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(post, range(4)))
    assert {r.status_code for r in responses} == {201}
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(jobs.jobs) == 1


def test_ray_down_at_submit_is_503_and_leaves_no_record(client, jobs) -> None:
    jobs.available = False
    response = client.post("/v1/sweeps", json=sweep_body(), headers={"Idempotency-Key": "retry-me"})
    assert response.status_code == 503 and "fake Ray is down" in response.json()["message"]
    jobs.available, jobs.refuse = True, True
    response = client.post("/v1/sweeps", json=sweep_body(), headers={"Idempotency-Key": "retry-me"})
    assert response.status_code == 503 and "Ray refused the job" in response.json()["message"]
    jobs.refuse = False
    assert client.get("/v1/sweeps").json()["items"] == []
    assert client.post("/v1/sweeps", json=sweep_body(), headers={"Idempotency-Key": "retry-me"}).status_code == 201


# -- restart and reconciliation -------------------------------------------------------------------


def test_records_survive_a_restart_and_are_reconciled_on_start_up(settings, jobs) -> None:
    with TestClient(create_app(settings, jobs), headers=bearer()) as client:
        running, lost = _submit(client), _submit(client)
        jobs.set(running["ray_submission_id"], "RUNNING")
        reconcile(client)
        assert client.get(f"/v1/sweeps/{running['id']}").json()["status"] == "running"
    jobs.set(running["ray_submission_id"], "SUCCEEDED")
    del jobs.jobs[lost["ray_submission_id"]]  # e.g. the Ray cluster was replaced while we were down
    app = create_app(settings, jobs)
    store = app.state.plane.store
    store.update(store.get("sweep", lost["id"]), created_at=time.time() - SUBMIT_GRACE_S - 1)
    with TestClient(app, headers=bearer()):
        # the background reconciliation from start-up on, before any request reads the records
        wait_for(lambda: store.get("sweep", lost["id"]).status == "failed", 30, 0.1, "start-up reconciliation")
        assert store.get("sweep", running["id"]).status == "succeeded"
        assert "Ray has no job" in store.get("sweep", lost["id"]).message


def test_a_silent_ray_is_said_on_unfinished_records_and_a_replaced_cluster_fails_them(client, jobs) -> None:
    """The head lost (the whole cluster with it): the reconciler cannot ask Ray, so the records say so instead of
    showing 'running' as if nothing happened; once a new cluster answers without the job, the sweep fails with
    what to do next (resume), at once rather than after the submission grace."""
    sweep = _submit(client)
    jobs.set(sweep["ray_submission_id"], "RUNNING")
    reconcile(client)
    jobs.available = False
    reconcile(client)
    silent = client.get(f"/v1/sweeps/{sweep['id']}").json()
    assert silent["status"] == "running" and silent["message"].startswith("Ray unreachable since"), silent
    reconcile(client)  # said once: the time is the first silent pass's
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["message"] == silent["message"]
    jobs.available = True  # back as it was: the job's own message again
    reconcile(client)
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["message"] == ""
    jobs.available = False
    reconcile(client)
    jobs.available = True
    del jobs.jobs[sweep["ray_submission_id"]]  # a new cluster: it never heard of the job
    reconcile(client)
    lost = client.get(f"/v1/sweeps/{sweep['id']}").json()
    assert lost["status"] == "failed", lost
    assert "Ray has no job" in lost["message"] and f"/v1/sweeps/{sweep['id']}/resume" in lost["message"]
    assert lost["links"]["resume"] == f"/v1/sweeps/{sweep['id']}/resume"


def test_resume_continues_a_failed_or_cancelled_sweep_as_a_new_job(client, jobs) -> None:
    sweep = _submit(client)
    path = f"/v1/sweeps/{sweep['id']}/resume"
    response = client.post(path)  # pending: nothing to resume
    assert response.status_code == 409 and "pending" in response.json()["message"]
    jobs.set(sweep["ray_submission_id"], "FAILED", "the driver's node died")
    resumed = client.post(path)
    assert resumed.status_code == 200, resumed.text
    body = resumed.json()
    assert body["id"] == sweep["id"] and body["status"] == "pending" and body["settled"] is False
    assert body["ray_submission_id"] == f"gmts-{sweep['id']}-resume-1"
    assert body["message"].startswith("resumed (it was failed: the driver's node died")
    job = jobs.jobs[body["ray_submission_id"]]
    original = jobs.jobs[sweep["ray_submission_id"]]
    assert job["entrypoint"] == original["entrypoint"] + " --resume"  # the same job file and output folder
    assert job["env_vars"] == original["env_vars"] and job["metadata"] == original["metadata"]
    assert client.post(path).status_code == 409  # it runs again
    client.post(f"/v1/sweeps/{sweep['id']}/cancel")
    again = client.post(path)
    assert again.status_code == 200 and again.json()["ray_submission_id"] == f"gmts-{sweep['id']}-resume-2"
    jobs.set(again.json()["ray_submission_id"], "SUCCEEDED")
    reconcile(client)
    refused = client.post(path)
    assert refused.status_code == 409 and "succeeded" in refused.json()["message"]
    assert client.post("/v1/sweeps/sw-0123456789abcdef/resume").status_code == 404


# -- cancel, logs, results ------------------------------------------------------------------------


def _fake_sweep_runs(settings: ApiSettings, api_id: str, spec_name: str) -> tuple[MlflowClient, str, list[str]]:
    """MLflow runs as sweeps.run and orchestrator.train create them: a parent and tagged children."""
    mlflow = MlflowClient(settings.tracking_uri())
    experiment = mlflow.get_experiment_by_name("gmts-lab") or mlflow.get_experiment(mlflow.create_experiment("gmts-lab"))
    parent = mlflow.create_run(experiment.experiment_id, tags={SWEEP_ID_TAG: f"{spec_name}-1", SPEC_NAME_TAG: spec_name})
    children = []
    for index, (method, status) in enumerate([("none", "FINISHED"), ("ets", "RUNNING"), ("gmts", "RUNNING")]):
        child = mlflow.create_run(experiment.experiment_id, tags={
            PARENT_TAG: parent.info.run_id, API_ID_TAG: api_id, TRIAL_TAG: f"{spec_name}-t{index:03d}"})
        for key, value in {"method": method, "ratio": "" if method == "none" else "0.2", "mode": "top",
                           "model_size": "tiny-s", "algorithm": "grpo", "seed": "0"}.items():
            mlflow.log_param(child.info.run_id, key, value)
        mlflow.log_metric(child.info.run_id, "eval/arithmetic/accuracy", 0.1 * (index + 1), step=1)
        if status == "FINISHED":
            mlflow.set_terminated(child.info.run_id, "FINISHED")
        children.append(child.info.run_id)
    return mlflow, parent.info.run_id, children


@pytest.mark.slow
def test_cancel_stops_the_job_and_kills_the_mlflow_runs(client, jobs, settings) -> None:
    sweep = _submit(client)
    jobs.set(sweep["ray_submission_id"], "RUNNING")
    mlflow, parent, children = _fake_sweep_runs(settings, sweep["id"], "api-test")
    reconcile(client)
    status = client.get(f"/v1/sweeps/{sweep['id']}").json()
    assert status["mlflow"]["run_id"] == parent
    assert mlflow.get_run(parent).data.tags[API_ID_TAG] == sweep["id"]  # one id, in MLflow too
    assert status["mlflow"]["ui_url"].startswith("http://127.0.0.1:5000/#/experiments/")
    assert status["trials"] == {"total": 3, "running": 2, "finished": 1, "failed": 0, "killed": 0}
    response = client.post(f"/v1/sweeps/{sweep['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled" and response.json()["ray_status"] == "STOPPED"
    assert jobs.jobs[sweep["ray_submission_id"]]["status"] == "STOPPED"
    assert mlflow.get_run(parent).info.status == "KILLED"
    assert [mlflow.get_run(c).info.status for c in children] == ["FINISHED", "KILLED", "KILLED"]
    for _ in range(2):  # a client retrying its cancel after a timeout gets the state, not an error
        again = client.post(f"/v1/sweeps/{sweep['id']}/cancel")
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "cancelled" and again.json()["cancel_requested"] is True
    results = client.get(f"/v1/sweeps/{sweep['id']}/results").json()
    assert results["status"] == "cancelled" and results["complete"] is False
    assert results["note"].startswith("CANCELLED") and "1 of 3 trials finished" in results["note"]


def test_a_sweep_cancelled_before_its_parent_run_says_it_has_no_results(client, jobs) -> None:
    sweep = _submit(client)
    assert client.post(f"/v1/sweeps/{sweep['id']}/cancel").json()["status"] == "cancelled"
    response = client.get(f"/v1/sweeps/{sweep['id']}/results")
    assert response.status_code == 409
    assert response.json()["message"] == (f"sweep {sweep['id']} was cancelled before it opened its MLflow parent run: "
                                          "it has no results")
    assert client.post(f"/v1/sweeps/{sweep['id']}/cancel").status_code == 200
    jobs.set(sweep["ray_submission_id"], "SUCCEEDED")  # a finished record is final
    run = client.post("/v1/runs", json={"preset": "cpu-tiny-s", "overrides": {"training.steps": 1}}).json()
    assert client.post(f"/v1/runs/{run['id']}/cancel").status_code == 200
    repeat = client.post(f"/v1/runs/{run['id']}/cancel")
    assert repeat.status_code == 200 and repeat.json()["status"] == "cancelled"


@pytest.mark.slow  # a real driver process, killed and reaped across an API restart
def test_cancel_kills_a_driver_that_outlives_its_job_even_across_a_restart(settings, jobs) -> None:
    """Ray says STOPPED, yet a driver of the job goes on (it ignores SIGTERM) and opens an MLflow run
    after the cancel: the cancel answers 202 naming it, the service escalates to SIGKILL — here in a
    restarted API process — closes the late run KILLED, and settles the record. The driver is a real
    process (its command line is the job's entrypoint); Ray is the fake of conftest.py."""
    settings.reconcile_interval_s, settings.kill_grace_s, settings.settle_quiet_s = 0.3, 8.0, 1.0
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    with TestClient(create_app(settings, jobs), headers=bearer()) as client:
        sweep = _submit(client)
        jobs.set(sweep["ray_submission_id"], "RUNNING")
        job_file = str(settings.state_dir / "jobs" / f"{sweep['id']}.yaml")
        driver = subprocess.Popen([sys.executable, "-c", stubborn, "api.job", "sweep", job_file])
    try:
        with TestClient(create_app(settings, jobs), headers=bearer()) as client:
            mlflow, parent, _ = _fake_sweep_runs(settings, sweep["id"], "api-test")
            response = client.post(f"/v1/sweeps/{sweep['id']}/cancel")
            assert response.status_code == 202, response.text
            body = response.json()
            assert body["status"] == "cancelled" and body["settled"] is False
            sigterm = f"cancel: the job's driver (pid {driver.pid}) outlived Ray's stop; sent SIGTERM"
            assert body["warnings"][0] == sigterm, body["warnings"]
            assert f"driver process(es) [{driver.pid}] alive" in body["warnings"][-1]
            assert mlflow.get_run(parent).info.status == "KILLED"
            assert driver.poll() is None  # SIGTERM is ignored: only the escalation can end it
        # A new API process (the old one is gone): its background reconciler finishes the job.
        with TestClient(create_app(settings, jobs), headers=bearer()) as client:
            experiment = mlflow.get_run(parent).info.experiment_id
            late = mlflow.create_run(experiment, tags={PARENT_TAG: parent, API_ID_TAG: sweep["id"]})  # after it all
            wait_for(lambda: driver.poll() is not None, 30, 0.2, "the SIGKILL")
            assert driver.returncode == -signal.SIGKILL
            wait_for(lambda: mlflow.get_run(late.info.run_id).info.status == "KILLED", 30, 0.2, "the late run KILLED")
            wait_for(lambda: client.get(f"/v1/sweeps/{sweep['id']}").json()["settled"], 30, 0.2, "the record to settle")
            again = client.post(f"/v1/sweeps/{sweep['id']}/cancel")
            assert again.status_code == 200 and again.json()["status"] == "cancelled"
            # what it took, noted once each though this process sent SIGTERM again after the restart
            sigkill = f"cancel: the job's driver (pid {driver.pid}) was still alive 8 s after SIGTERM; sent SIGKILL"
            assert again.json()["warnings"] == [sigterm, sigkill]
            assert client.get(f"/v1/sweeps/{sweep['id']}").json()["warnings"] == [sigterm, sigkill]
    finally:
        driver.kill()
        driver.wait()


def test_a_cancel_that_had_to_kill_the_driver_says_so(settings, jobs) -> None:
    """Ray says STOPPED but the job's driver (a real process with the job's command line; Ray is the fake
    of conftest.py) is still there: the reaper's SIGTERM ends it, the cancel answers 200 — and says what
    it had to kill."""
    settings.cancel_wait_s = 30.0  # only the bound: the answer comes once a check finds nothing
    with TestClient(create_app(settings, jobs), headers=bearer()) as client:
        run = client.post("/v1/runs", json={"preset": "cpu-tiny-s", "overrides": {"training.steps": 1}}).json()
        jobs.set(run["ray_submission_id"], "RUNNING")
        job_file = str(settings.state_dir / "jobs" / f"{run['id']}.yaml")
        driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "api.job", "run", job_file])
        try:
            response = client.post(f"/v1/runs/{run['id']}/cancel")
            assert driver.wait(timeout=30) == -signal.SIGTERM
        finally:
            driver.kill()
            driver.wait()
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"
    assert response.json()["warnings"] == [f"cancel: the job's driver (pid {driver.pid}) outlived Ray's stop; sent SIGTERM"]


@pytest.mark.slow
def test_cancel_that_ray_has_not_finished_yet_is_202(client, jobs) -> None:
    sweep = _submit(client)
    jobs.set(sweep["ray_submission_id"], "RUNNING")
    jobs.stop_takes_effect = False
    response = client.post(f"/v1/sweeps/{sweep['id']}/cancel")
    assert response.status_code == 202
    assert response.json()["status"] == "running" and response.json()["cancel_requested"] is True
    jobs.set(sweep["ray_submission_id"], "STOPPED")
    reconcile(client)
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "cancelled"


@pytest.mark.slow
def test_a_restarted_trial_counts_once_and_its_dead_attempt_is_closed(client, jobs, settings) -> None:
    sweep = _submit(client)
    jobs.set(sweep["ray_submission_id"], "RUNNING")
    mlflow, parent, children = _fake_sweep_runs(settings, sweep["id"], "api-test")
    experiment = mlflow.get_run(parent).info.experiment_id
    # trial 1 again: Tune restarted it after its first attempt died; the new attempt finishes
    retry = mlflow.create_run(experiment, tags={PARENT_TAG: parent, API_ID_TAG: sweep["id"], TRIAL_TAG: "api-test-t001"})
    mlflow.set_terminated(retry.info.run_id, "FINISHED")
    mlflow.set_terminated(children[2], "FINISHED")
    mlflow.set_terminated(parent, "FINISHED")
    jobs.set(sweep["ray_submission_id"], "SUCCEEDED")
    reconcile(client)
    body = client.get(f"/v1/sweeps/{sweep['id']}").json()
    assert body["status"] == "succeeded"
    assert body["trials"] == {"total": 3, "running": 0, "finished": 3, "failed": 0, "killed": 0}
    assert mlflow.get_run(children[1]).info.status == "FAILED"  # the dead attempt no longer shows as running
    assert mlflow.get_run(parent).info.status == "FINISHED"


@pytest.mark.slow
def test_a_finished_sweep_is_never_shown_with_the_counts_of_a_pass_before(client, jobs, settings) -> None:
    """Between the pass that stores "succeeded" and the MLflow counts, a reader polling the status must
    not see a finished sweep with a trial still running (what a client waiting for the end reads)."""
    sweep = _submit(client)
    jobs.set(sweep["ray_submission_id"], "RUNNING")
    mlflow, parent, children = _fake_sweep_runs(settings, sweep["id"], "api-test")
    reconcile(client)
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["trials"]["running"] == 2
    for run_id in (*children[1:], parent):  # the driver closes every run, then Ray calls the job done
        mlflow.set_terminated(run_id, "FINISHED")
    jobs.set(sweep["ray_submission_id"], "SUCCEEDED")
    plane = client.app.state.plane
    seen: list[tuple[str, int, int]] = []
    store_update = plane.store.update

    def update_and_read_back(record, **changes):
        updated = store_update(record, **changes)
        row = plane.store.by_id(record.id)
        seen.append((row.status, row.trials_running, row.trials_finished))
        return updated

    plane.store.update = update_and_read_back
    try:
        reconcile(client)
    finally:
        plane.store.update = store_update
    assert seen and seen[-1] == ("succeeded", 0, 3), seen
    assert all((running, finished) == (0, 3) for status, running, finished in seen if status == "succeeded"), seen


def test_logs_tail(client, jobs) -> None:
    sweep = _submit(client)
    jobs.set(sweep["ray_submission_id"], "RUNNING", logs="\n".join(f"line {i}" for i in range(500)))
    body = client.get(f"/v1/sweeps/{sweep['id']}/logs", params={"tail": 3}).json()
    assert body["lines"] == ["line 497", "line 498", "line 499"] and body["truncated"] is True
    assert client.get(f"/v1/sweeps/{sweep['id']}/logs", params={"tail": 0}).status_code == 422


@pytest.mark.slow
def test_results_are_the_reports_ablation_table(client, jobs, settings) -> None:
    sweep = _submit(client)
    early = client.get(f"/v1/sweeps/{sweep['id']}/results")
    assert early.status_code == 409 and "no MLflow parent run yet" in early.json()["message"]
    _, parent, _ = _fake_sweep_runs(settings, sweep["id"], "api-test")
    jobs.set(sweep["ray_submission_id"], "SUCCEEDED")
    reconcile(client)
    response = client.get(f"/v1/sweeps/{sweep['id']}/results")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["parent_run_id"] == parent and body["status"] == "succeeded"
    # two of the fake trials never finished (the reconciler closed them FAILED): the table says so
    assert body["complete"] is False and body["note"] == "INCOMPLETE: 1 of 3 trials finished"
    assert body["results"] == json.loads(json.dumps(ablation_results(settings.tracking_uri(), parent)))


def test_unknown_ids(client) -> None:
    for path in ("/v1/sweeps/sw-ffffffffffffffff", "/v1/sweeps/sw-ffffffffffffffff/logs", "/v1/runs/run-ffffffffffffffff"):
        response = client.get(path)
        assert response.status_code == 404 and "no " in response.json()["message"]
    assert client.get("/v1/sweeps/../../etc/passwd").status_code == 404
    assert client.get("/v1/sweeps/sw-..%2F..%2Fetc").status_code == 404  # %2F splits the path: no route
    response = client.get("/v1/sweeps/sw-NOT-HEX")
    assert response.status_code == 422 and "sweep_id" in response.json()["message"]


def test_job_files_are_not_world_readable_or_shared(client, settings) -> None:
    sweep = _submit(client)
    job_file = settings.state_dir / "jobs" / f"{sweep['id']}.yaml"
    assert yaml.safe_load(job_file.read_text())["name"] == "api-test"
    assert os.stat(job_file).st_mode & 0o077 == 0


def _modes(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): oct(path.stat().st_mode & 0o777) for path in [folder, *folder.rglob("*")]}


@pytest.mark.slow
def test_every_folder_and_file_the_service_makes_is_owner_only(settings, jobs, tmp_path: Path) -> None:
    """A state dir left 0755 (made by hand, or by an older version) is tightened; what the service creates
    — folders with their missing parents, job files, each submission's run folder — is 0700/0600."""
    (tmp_path / "new").mkdir(mode=0o755)
    settings = ApiSettings(api_token=TOKEN, state_dir=tmp_path / "new" / "parent" / "state",
                           allowed_roots=settings.allowed_roots, mlflow_tracking_uri=settings.mlflow_tracking_uri)
    with TestClient(create_app(settings, jobs), headers=bearer()) as client:
        sweep, run = _submit(client), client.post("/v1/runs", json={"preset": "cpu-tiny-s"}).json()
        assert run["status"] == "pending", run
    modes = _modes(settings.state_dir)
    folders = {".", "jobs", "runs", f"runs/{sweep['id']}", f"runs/{run['id']}"}
    assert {name: mode for name, mode in modes.items() if name in folders} == dict.fromkeys(folders, "0o700")
    assert {name: mode for name, mode in modes.items() if name not in folders} == dict.fromkeys(
        set(modes) - folders, "0o600")
    assert {"api.db", f"jobs/{sweep['id']}.yaml", f"jobs/{run['id']}.yaml"} <= set(modes)
    assert oct((tmp_path / "new" / "parent").stat().st_mode & 0o777) == "0o700"  # created by the service
    assert oct((tmp_path / "new").stat().st_mode & 0o777) == "0o755"  # not the service's: left alone

    settings.state_dir.chmod(0o755)
    (settings.state_dir / "runs").chmod(0o755)
    settings.mlflow_tracking_uri = None  # the default store, sqlite:///<state>/mlflow.db
    plane = ControlPlane(settings, jobs, TrackingView(settings.tracking_uri(), None))
    plane.close()
    modes = _modes(settings.state_dir)
    assert (modes["."], modes["runs"], modes["mlflow.db"]) == ("0o700", "0o700", "0o600")


def test_the_state_database_and_its_wal_files_are_owner_only(settings, jobs) -> None:
    settings.state_dir.mkdir(parents=True)
    database = settings.state_dir / "api.db"
    database.touch(mode=0o644)  # as an older version left it
    database.chmod(0o644)
    with TestClient(create_app(settings, jobs), headers=bearer()) as client:
        _submit(client)
        files = [database, database.with_name("api.db-wal"), database.with_name("api.db-shm")]
        assert all(file.exists() for file in files)
        assert {file.name: oct(file.stat().st_mode & 0o777) for file in files} == {
            file.name: "0o600" for file in files}


# -- offline docs ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("page", "assets"), [("/docs", 3), ("/redoc", 2)])
def test_docs_pages_load_only_local_assets(settings, jobs, page: str, assets: int) -> None:
    """An offline cluster has no CDN: every script, stylesheet and icon of /docs and /redoc is a path
    of this server, and each one is served (by content, not just a 200)."""
    import re

    with TestClient(create_app(settings, jobs)) as client:  # no token: the docs are public, like /openapi.json
        html = client.get(page)
        assert html.status_code == 200 and "text/html" in html.headers["content-type"]
        urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url:\s*['"]([^'"]+)['"]""", html.text)
        urls = [next(u for u in pair if u) for pair in urls]
        assert not [u for u in urls if re.match(r"^(https?:)?//", u)], urls  # nothing from another host
        assert "cdn.jsdelivr" not in html.text and "fonts.googleapis" not in html.text
        local = [u for u in urls if u.startswith("/static-offline-docs/")]
        assert len(local) == assets, urls
        for url in local:
            asset = client.get(url)
            assert asset.status_code == 200 and len(asset.content) > 1000, url
        assert "/openapi.json" in html.text and client.get("/openapi.json").status_code == 200
