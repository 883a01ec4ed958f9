"""DatasetSpec / DataConfig validation: good specs resolve sensibly, bad ones name their field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.data.config import DEFAULT_INSTRUCTIONS, DataConfig, DatasetSpec, PromptTemplateConfig


def _error_text(excinfo: pytest.ExceptionInfo[ValidationError]) -> str:
    """All error locations and messages of a ValidationError, one per line."""
    return "\n".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in excinfo.value.errors())


def test_unknown_builtin_names_source_and_lists_choices() -> None:
    with pytest.raises(ValidationError) as excinfo:
        DatasetSpec(source="mathh500")
    text = _error_text(excinfo)
    assert text.startswith("source:")
    assert "'mathh500'" in text and "math500" in text


def test_missing_file_names_source(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ValidationError) as excinfo:
        DatasetSpec(source=str(missing))
    assert _error_text(excinfo).startswith("source:")
    assert "does not exist" in _error_text(excinfo)


def test_existing_file_is_accepted_and_has_no_split(tmp_path: Path) -> None:
    path = tmp_path / "mine.parquet"
    path.write_bytes(b"")
    spec = DatasetSpec(source=str(path))
    assert spec.is_file and spec.resolved_split is None
    with pytest.raises(ValidationError, match="split: a file is one split"):
        DatasetSpec(source=str(path), split="train")


def test_split_defaults_per_source_kind() -> None:
    assert DatasetSpec(source="arithmetic").resolved_split == "train"
    assert DatasetSpec(source="math500").resolved_split == "test"
    with pytest.raises(ValidationError, match="split: 'gsm8k' ships only the 'test' split"):
        DatasetSpec(source="gsm8k", split="train")


def test_arithmetic_options_are_checked_by_field() -> None:
    with pytest.raises(ValidationError) as excinfo:
        DatasetSpec(source="arithmetic", arithmetic={"digits": 4})
    assert excinfo.value.errors()[0]["loc"] == ("arithmetic", "digits")
    with pytest.raises(ValidationError) as excinfo:
        DatasetSpec(source="arithmetic", arithmetic={"operations": ["/"]})
    assert excinfo.value.errors()[0]["loc"][:2] == ("arithmetic", "operations")
    with pytest.raises(ValidationError, match="operations must be distinct"):
        DatasetSpec(source="arithmetic", arithmetic={"operations": ["+", "+"]})
    with pytest.raises(ValidationError, match="arithmetic: options given, but source is 'math500'"):
        DatasetSpec(source="math500", arithmetic={"digits": 2})


def test_reasoning_gym_task_checked_at_validation_time() -> None:
    with pytest.raises(ValidationError, match=r"reasoning_gym\.dataset: unknown task 'leg_countin'"):
        DatasetSpec(source="reasoning_gym", limit=5, reasoning_gym={"dataset": "leg_countin"})
    with pytest.raises(ValidationError, match=r"reasoning_gym\.kwargs: invalid for task 'leg_counting'"):
        DatasetSpec(
            source="reasoning_gym", limit=5, reasoning_gym={"dataset": "leg_counting", "kwargs": {"legs": 3}}
        )
    with pytest.raises(ValidationError, match="limit: source 'reasoning_gym'"):
        DatasetSpec(source="reasoning_gym", reasoning_gym={"dataset": "leg_counting"})
    with pytest.raises(ValidationError, match="reasoning_gym: source 'reasoning_gym' needs options"):
        DatasetSpec(source="reasoning_gym", limit=5)
    spec = DatasetSpec(
        source="reasoning_gym",
        limit=5,
        reasoning_gym={"dataset": "leg_counting", "kwargs": {"max_animals": 4}},
    )
    assert spec.reasoning_gym is not None and spec.reasoning_gym.kwargs == {"max_animals": 4}


def test_unknown_field_and_bad_limit_are_named() -> None:
    with pytest.raises(ValidationError) as excinfo:
        DatasetSpec(source="math500", shuffle=True)
    assert excinfo.value.errors()[0]["loc"] == ("shuffle",)
    with pytest.raises(ValidationError) as excinfo:
        DatasetSpec(source="math500", limit=0)
    assert excinfo.value.errors()[0]["loc"] == ("limit",)


def test_data_config_error_paths_include_the_nesting() -> None:
    with pytest.raises(ValidationError) as excinfo:
        DataConfig(train={"source": "arithmetic"}, eval={"held_out": {"source": "nope"}})
    assert excinfo.value.errors()[0]["loc"][:3] == ("eval", "held_out", "source")
    with pytest.raises(ValidationError) as excinfo:
        DataConfig(train={"source": "arithmetic"}, prompts_per_step=0)
    assert excinfo.value.errors()[0]["loc"] == ("prompts_per_step",)
    with pytest.raises(ValidationError, match="eval set name 'a b'"):
        DataConfig(train={"source": "arithmetic"}, eval={"a b": {"source": "math500"}})


def test_eval_sets_of_procedural_sources_default_to_the_test_split() -> None:
    config = DataConfig(
        train={"source": "arithmetic"},
        eval={
            "arith": {"source": "arithmetic"},
            "arith_train": {"source": "arithmetic", "split": "train"},
            "math": {"source": "math500"},
        },
    )
    assert config.train.resolved_split == "train"
    assert config.eval["arith"].resolved_split == "test"
    assert config.eval["arith_train"].resolved_split == "train"
    assert config.eval["math"].resolved_split == "test"


def test_instructions_override_merges_with_defaults() -> None:
    template = PromptTemplateConfig(instructions={"math": "Answer in \\boxed{}."})
    assert template.instructions["math"] == "Answer in \\boxed{}."
    assert template.instructions["code"] == DEFAULT_INSTRUCTIONS["code"]
    with pytest.raises(ValidationError) as excinfo:
        PromptTemplateConfig(instructions={"poetry": "rhyme"})
    assert excinfo.value.errors()[0]["loc"][:2] == ("instructions", "poetry")
    with pytest.raises(ValidationError) as excinfo:
        PromptTemplateConfig(kind="jinja")
    assert excinfo.value.errors()[0]["loc"] == ("kind",)


def test_config_round_trips_through_json() -> None:
    config = DataConfig(
        train={"source": "arithmetic", "arithmetic": {"digits": 1, "operations": ["+", "-"]}, "seed": 3},
        eval={"gym": {"source": "reasoning_gym", "limit": 4, "reasoning_gym": {"dataset": "leg_counting"}}},
        prompts_per_step=8,
        prompt_template={"kind": "plain"},
    )
    assert DataConfig.model_validate_json(config.model_dump_json()) == config


def test_null_removes_an_eval_set_a_preset_inherited() -> None:
    # Presets merge dicts: without this, a preset extending another could never drop a parent's eval set.
    config = DataConfig(train={"source": "arithmetic"},
                        eval={"kept": {"source": "arithmetic"}, "dropped": None})
    assert list(config.eval) == ["kept"] and config.eval["kept"].split == "test"
