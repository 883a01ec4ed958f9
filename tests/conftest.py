"""Fixtures shared across test packages."""

from __future__ import annotations

from pathlib import Path

import pytest

# The models the GPU presets name (their folders under $GMTS_MODELS_DIR).
GPU_MODELS = ("Qwen2.5-Math-1.5B", "Qwen2.5-Math-7B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Qwen3-8B", "Qwen2.5-Coder-1.5B",
              "Qwen2.5-Coder-7B")


@pytest.fixture
def gpu_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Stand-in model folders (a config.json is all validation looks at) and training files for the GPU
    presets; returns the models root."""
    models, data = tmp_path / "models", tmp_path / "data"
    for model in GPU_MODELS:
        (models / model).mkdir(parents=True)
        (models / model / "config.json").write_text("{}")
    data.mkdir()
    for name in ("math_train.parquet", "code_train.parquet"):
        (data / name).write_bytes(b"")
    monkeypatch.setenv("GMTS_MODELS_DIR", str(models))
    monkeypatch.setenv("GMTS_DATA_DIR", str(data))
    return models


@pytest.fixture(scope="session")
def _shared_ray_stopped_at_the_end():
    yield
    import ray

    ray.shutdown()


@pytest.fixture(scope="module")
def embedded_ray(_shared_ray_stopped_at_the_end) -> None:
    """One embedded Ray (``orchestrator.cluster.start_embedded``: 2 CPUs, every server on loopback) shared by the
    test modules that need a cluster but not one of their own: the first module that asks starts it, the next ones
    find it up (each start costs seconds on 2 cores), the session's end stops it. A module that needs Ray to itself
    (another cluster, other ``ray.init`` arguments) shuts it down first; the next module that asks starts it again.
    The modules that ask run last (``pytest_collection_modifyitems``)."""
    import ray

    from orchestrator.cluster import start_embedded

    if not ray.is_initialized():
        start_embedded(num_cpus=2, include_dashboard=False, log_to_driver=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test modules that use ``embedded_ray`` run last, one after the other, each whole and in its own order:
    one Ray start serves them all, and no Ray runs in this process while other tests fork sandboxed children."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    sharing = {module(item) for item in items if "embedded_ray" in getattr(item, "fixturenames", ())}
    items[:] = ([item for item in items if module(item) not in sharing]
                + [item for item in items if module(item) in sharing])
