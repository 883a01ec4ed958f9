"""Turn a ``ModelConfig`` into a HF folder (config.json, safetensors, tokenizer) for vLLM and transformers."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from workers.models.atomic_folder import build_folder_once
from workers.models.config import FOLDER_DTYPE, ModelConfig
from workers.models.smollm2 import smollm2_gguf_path, write_smollm2_model
from workers.models.tiny import write_tiny_model

logger = logging.getLogger(__name__)

# Bump when the folder layout written for a source changes, so that stale caches are not reused.
FORMAT_VERSION = 1

# Fields that change the weights or files of a materialised folder; the rest (size label, cache_dir) do
# not and must not split the cache.
TINY_FOLDER_FIELDS = (
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "init_seed",
)


def materialize_model(config: ModelConfig, cache_dir: str | Path | None = None) -> Path:
    """Return a HF model folder for ``config``, building and caching it the first time.

    ``cache_dir`` overrides ``config.cache_dir``. Source ``hf`` returns ``config.path`` as is.
    """
    if config.source == "hf":
        assert config.path is not None  # guaranteed by ModelConfig validation
        return config.path
    cache_dir = Path(cache_dir or config.cache_dir).expanduser()
    if config.source == "tiny":
        # The dtype stays in the keys (folders were once built in a configurable one): caches keep their names.
        key = {**{name: getattr(config, name) for name in TINY_FOLDER_FIELDS}, "dtype": FOLDER_DTYPE}
        return build_folder_once(
            cache_dir / f"tiny-{_fingerprint(key)}", lambda folder: write_tiny_model(config, folder)
        )
    gguf_path = smollm2_gguf_path()
    key = {"gguf": gguf_path.name, "gguf_bytes": gguf_path.stat().st_size, "dtype": FOLDER_DTYPE}
    return build_folder_once(
        cache_dir / f"smollm2-{_fingerprint(key)}", lambda folder: write_smollm2_model(config, folder)
    )


def _fingerprint(key: dict[str, object]) -> str:
    text = json.dumps({**key, "format_version": FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
