"""Fixtures of the API tests.

The fast tests drive the real app (real SQLite store, real MLflow SQLite store, real validation) with
a *fake* Ray Jobs backend, ``FakeJobs``: starting a Ray head costs ~10 s and 0.6 GB, and every job
it ran would start a real sweep on this 2-core machine. The real ``RayJobs`` client against a real
Ray head with token auth is exercised by the slow integration test (test_integration.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from api.app import create_app
from api.settings import ApiSettings
from tests.api.support import TOKEN, FakeJobs, serve


@pytest.fixture(autouse=True)
def gmts_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of its own as GMTS_HOME: no test reads or writes the user's `gmts up` stack."""
    home = tmp_path / "gmts-home"
    monkeypatch.setenv("GMTS_HOME", str(home))
    return home


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    """The one allowed root of model/data paths in these tests (the state dir is allowed too)."""
    root = tmp_path / "roots"
    root.mkdir()
    return root


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store, created once: creating its schema takes seconds, copying it none."""
    path = tmp_path_factory.mktemp("mlflow") / "template.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def settings(tmp_path: Path, roots: Path, mlflow_template: Path) -> ApiSettings:
    shutil.copyfile(mlflow_template, tmp_path / "mlflow.db")
    return ApiSettings(
        api_token=TOKEN,
        state_dir=tmp_path / "state",
        allowed_roots=[roots, Path("~/.cache/gmts-lab")],  # the shipped presets cache models there
        mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        mlflow_ui_url="http://127.0.0.1:5000",
        max_body_bytes=8192,
        cancel_wait_s=1.0,
    )


@pytest.fixture
def settings_(settings: ApiSettings) -> ApiSettings:
    """The same, under a name that hypothesis' ``settings`` decorator does not shadow."""
    return settings


@pytest.fixture
def jobs() -> FakeJobs:
    return FakeJobs()


@pytest.fixture
def client(settings: ApiSettings, jobs: FakeJobs) -> Iterator[TestClient]:
    with TestClient(create_app(settings, jobs), headers={"Authorization": f"Bearer {TOKEN}"}) as test_client:
        yield test_client


@pytest.fixture
def served_app(settings: ApiSettings, jobs: FakeJobs) -> FastAPI:
    """The app that ``served`` serves (for ``support.reconcile``)."""
    return create_app(settings, jobs)


@pytest.fixture
def served(served_app: FastAPI) -> Iterator[str]:
    """The app under a real uvicorn server on a free loopback port; yields its base URL."""
    with serve(served_app) as url:
        yield url


QUICKSTART_TEST = "test_readme_quickstart_runs_as_written"


@pytest.fixture(scope="session")
def readme_quickstart():
    """The README's quickstart, running in the background from the first request on; ended at the session's end
    (its test ends it sooner)."""
    from tests.api.test_readme_quickstart import QuickstartRun

    run = QuickstartRun()
    run.start()
    yield run
    run.stop()


@pytest.fixture(scope="module", autouse=True)
def _quickstart_beside_the_integration_tests(request: pytest.FixtureRequest) -> None:
    """Where the session runs both, the quickstart starts with the integration module and runs beside it: each
    leaves a core idle much of its time, so the two together end sooner than one after the other. Its test reads
    the outcome later; a module run alone starts nothing extra."""
    if request.module.__name__.endswith(".test_integration") and any(
            item.name == QUICKSTART_TEST for item in request.session.items):
        request.getfixturevalue("readme_quickstart")
