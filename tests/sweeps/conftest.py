"""Shared fixtures of the sweep tests: a small stand-alone experiment preset and sweep-spec files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

# A complete experiment config (tiny model, arithmetic data) that does not depend on the shipped
# presets, so that spec validation is tested against a base we control.
TEST_PRESET: dict[str, Any] = {
    "name": "test-tiny",
    "model": {"source": "tiny", "size": "tiny-test", "hidden_size": 64, "num_attention_heads": 2,
              "num_key_value_heads": 1, "num_layers": 1, "intermediate_size": 128, "max_position_embeddings": 32},
    "rollout": {"n_samples": 4, "max_new_tokens": 5, "max_prompt_tokens": 8},
    "selection": {"method": "gmts", "ratio": 0.2, "mode": "top"},
    "data": {
        "train": {"source": "arithmetic", "split": "train"},
        "eval": {"arithmetic": {"source": "arithmetic", "split": "test", "limit": 20}},
        "prompts_per_step": 4,
        "prompt_template": {"kind": "plain"},
    },
    "learner": {"mini_batch_size": 16, "micro_batch_size": 16},
    "training": {"steps": 2},
}


@pytest.fixture
def preset_file(tmp_path: Path) -> Path:
    path = tmp_path / "test-preset.yaml"
    path.write_text(yaml.safe_dump(TEST_PRESET))
    return path


@pytest.fixture
def write_spec(tmp_path: Path, preset_file: Path):
    """Write a sweep spec YAML whose base is the test preset; returns its path."""

    def write(**fields: Any) -> Path:
        spec = {"name": "test-sweep", "base": {"preset": str(preset_file)}, **fields}
        path = tmp_path / f"{spec['name']}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    return write
