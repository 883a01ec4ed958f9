from pathlib import Path

import pytest

from workers.models.config import ModelConfig
from workers.models.materialize import materialize_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random tiny Qwen2 (hidden 128, 2 layers, tied embeddings): near-uniform over 18 tokens."""
    return materialize_model(ModelConfig(), tmp_path_factory.mktemp("rollout_models"))
