from pathlib import Path

import pytest
from pydantic import ValidationError

from workers.models.config import ModelConfig


def _error_fields(error: ValidationError) -> list[tuple]:
    return [item["loc"] for item in error.errors()]


def test_defaults_describe_a_vllm_compatible_tiny_model():
    config = ModelConfig()
    assert config.source == "tiny"
    assert config.head_dim == 64
    assert config.size_label == "tiny-h128-l2"
    assert config.cache_dir.is_absolute()  # "~" expanded


@pytest.mark.parametrize(
    ("hidden_size", "heads", "message"),
    [(64, 4, "head_dim"), (128, 3, "not divisible"), (48, 1, "head_dim")],
)
def test_head_dim_outside_vllm_cpu_kernels_is_rejected_on_the_heads_field(hidden_size, heads, message):
    with pytest.raises(ValidationError, match=message) as error:
        ModelConfig(hidden_size=hidden_size, num_attention_heads=heads, num_key_value_heads=1)
    assert _error_fields(error.value) == [("num_attention_heads",)]


def test_kv_heads_must_divide_attention_heads():
    with pytest.raises(ValidationError) as error:
        ModelConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=3)
    assert _error_fields(error.value) == [("num_key_value_heads",)]


def test_hf_source_needs_an_existing_hf_folder(tmp_path: Path):
    with pytest.raises(ValidationError, match="required") as missing:
        ModelConfig(source="hf", size="1.5b")
    assert _error_fields(missing.value) == [("path",)]
    with pytest.raises(ValidationError, match="no config.json") as not_a_model:
        ModelConfig(source="hf", path=tmp_path)
    assert _error_fields(not_a_model.value) == [("path",)]

    (tmp_path / "config.json").write_text("{}")
    config = ModelConfig(source="hf", path=tmp_path, size="1.5b")
    assert config.path == tmp_path and config.size_label == "1.5b"


def test_path_is_rejected_for_other_sources(tmp_path: Path):
    with pytest.raises(ValidationError, match="only used with source='hf'") as error:
        ModelConfig(source="smollm2", path=tmp_path)
    assert _error_fields(error.value) == [("path",)]


def test_unknown_fields_are_rejected():
    with pytest.raises(ValidationError) as error:
        ModelConfig(hidden=128)
    assert _error_fields(error.value) == [("hidden",)]
