"""Reads never wait on Ray or MLflow: list and get serve the SQLite rows the background reconciler
keeps, so they answer — with the last known state — while Ray and MLflow hang.

The hanging dependencies are real sockets on loopback that accept connections and never answer (a
"black hole"): the service's real Ray Jobs client (``RayJobs``, i.e. ``JobSubmissionClient``) and its
real MLflow client talk to them and block, as they would with a wedged dashboard or tracking server.
The records were written before by the same app code against the fake Ray of conftest.py and a
real MLflow SQLite store.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from api.app import create_app
from api.deferred import DeferredApp
from api.ray_jobs import RayJobs
from api.tracking_view import API_ID_TAG
from tests.api.support import bearer, reconcile, serve, sweep_body, wait_for


class BlackHole:
    """A loopback TCP server that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:  # the blocked clients get EOF and give up
            conn.close()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    yield hole
    hole.close()


@pytest.mark.slow  # waits out the hung backends' timeouts
def test_list_and_get_answer_from_sqlite_while_ray_and_mlflow_hang(settings, jobs, black_hole: BlackHole) -> None:
    # 1. Records as a healthy service leaves them: a running sweep with one trial run open in MLflow.
    with TestClient(create_app(settings, jobs), headers=bearer()) as client:
        sweep = client.post("/v1/sweeps", json=sweep_body()).json()
        run = client.post("/v1/runs", json={"preset": "cpu-tiny-s", "overrides": {"training.steps": 1}}).json()
        jobs.set(sweep["ray_submission_id"], "RUNNING")
        mlflow = MlflowClient(settings.tracking_uri())
        experiment = mlflow.get_experiment_by_name("gmts-lab") or mlflow.get_experiment(mlflow.create_experiment("gmts-lab"))
        parent = mlflow.create_run(experiment.experiment_id, tags={"gmts.sweep_id": sweep["id"]})
        mlflow.create_run(experiment.experiment_id, tags={"mlflow.parentRunId": parent.info.run_id,
                                                           API_ID_TAG: sweep["id"], "gmts.trial": "t0"})
        reconcile(client)
        expected = client.get(f"/v1/sweeps/{sweep['id']}").json()
    assert expected["status"] == "running" and expected["mlflow"]["run_id"] == parent.info.run_id
    assert expected["trials"]["running"] == 1

    # 2. The same state dir, served by a process whose Ray and MLflow both hang.
    settings.mlflow_tracking_uri = f"http://127.0.0.1:{black_hole.port}"
    settings.reconcile_interval_s = 0.1
    app = create_app(settings, RayJobs(f"http://127.0.0.1:{black_hole.port}", None))
    with serve(app) as url:
        wait_for(lambda: black_hole.accepted, 30, 0.05, "the reconciler to call the hanging Ray")
        with httpx.Client(base_url=url, headers=bearer(), timeout=10) as http:
            listed = http.get("/v1/sweeps")
            one = http.get(f"/v1/sweeps/{sweep['id']}")
            runs = http.get("/v1/runs")
            single = http.get(f"/v1/runs/{run['id']}")
            health = http.get("/healthz")
        reconciler = next(t for t in threading.enumerate() if t.name == "gmts-reconciler")
        assert reconciler.is_alive()  # still stuck inside its first pass
        black_hole.close()  # let it out, so that the app can shut down
    assert health.status_code == 200
    assert listed.status_code == 200 and [item["id"] for item in listed.json()["items"]] == [sweep["id"]]
    assert one.status_code == 200
    body = one.json()
    assert (body["status"], body["ray_status"], body["trials"], body["mlflow"]["run_id"]) == (
        "running", "RUNNING", expected["trials"], parent.info.run_id)
    assert [item["id"] for item in runs.json()["items"]] == [run["id"]]
    assert single.json()["status"] == "pending"


@pytest.mark.slow
def test_healthz_answers_while_the_app_is_still_loading(settings, jobs) -> None:
    """gmts serve's wrapper (api/deferred.py) under real uvicorn: /healthz answers before the app is
    built (its imports take seconds to a minute); other requests wait for it and then reach it."""
    release, failed = threading.Event(), []

    def load():
        release.wait(60)
        app = create_app(settings, jobs)
        return app, app.state.plane.close

    with serve(DeferredApp(load)) as url, httpx.Client(base_url=url, headers=bearer(), timeout=60) as http:
        assert http.get("/healthz", timeout=5).json() == {"status": "ok"}  # the app is not built yet
        waiting = []
        reader = threading.Thread(target=lambda: waiting.append(http.get("/v1/sweeps")))
        reader.start()
        reader.join(1.0)
        assert reader.is_alive() and not waiting  # held until the app exists
        release.set()
        reader.join(60)
        assert waiting[0].status_code == 200 and waiting[0].json()["items"] == []
        assert http.get("/v1/sweeps", headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code == 401

    def broken():
        raise RuntimeError("no such module")

    with serve(DeferredApp(broken, on_failure=lambda: failed.append(True))) as url:
        response = wait_for(lambda: (r := httpx.get(f"{url}/v1/sweeps", timeout=10)).status_code == 503 and r, 30,
                            0.1, "the failed load")
        assert response.json()["message"] == "the API failed to start: RuntimeError: no such module"
        assert failed == [True]


def test_repeated_reads_skip_sqlite_until_a_write_and_then_show_it(client, jobs) -> None:
    """List and get are served as ready bytes (api/reads.py) while the store is unchanged: no query
    reaches SQLite; the first read after a write (the reconciler's, a submit) shows that write."""
    sweep = client.post("/v1/sweeps", json=sweep_body()).json()
    queries: list[str] = []
    client.app.state.plane.store._db.set_trace_callback(queries.append)  # every statement SQLite runs
    first_get, first_list = client.get(f"/v1/sweeps/{sweep['id']}").json(), client.get("/v1/sweeps").json()
    built = len(queries)
    assert built >= 2  # each was built once, from SQLite
    for _ in range(5):
        assert client.get(f"/v1/sweeps/{sweep['id']}").json() == first_get
        assert client.get("/v1/sweeps").json() == first_list
    assert len(queries) == built
    assert first_get["status"] == "pending" and first_list["items"] == [first_get]

    jobs.set(sweep["ray_submission_id"], "RUNNING")
    reconcile(client)
    assert client.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "running"
    assert [item["status"] for item in client.get("/v1/sweeps").json()["items"]] == ["running"]
    second = client.post("/v1/sweeps", json=sweep_body(name="api-test-2")).json()
    assert [item["id"] for item in client.get("/v1/sweeps").json()["items"]] == [second["id"], sweep["id"]]
    assert client.get("/v1/sweeps", params={"status": "pending"}).json()["items"][0]["id"] == second["id"]
    assert client.get("/v1/sweeps/sw-0123456789abcdef").status_code == 404  # a miss is not cached as a body
