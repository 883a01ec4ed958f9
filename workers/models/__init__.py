"""Policy models: which one (``ModelConfig``) and its HF folder on disk (``materialize_model``)."""

from workers.models.config import ModelConfig
from workers.models.materialize import materialize_model

__all__ = ["ModelConfig", "materialize_model"]
