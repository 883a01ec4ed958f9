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
