import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.models.char_tokenizer import VOCAB
from workers.models.config import ModelConfig
from workers.models.materialize import materialize_model

TINY = ModelConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model_cache")


@pytest.fixture(scope="module")
def tiny_folder(cache_dir) -> Path:
    return materialize_model(TINY, cache_dir)


def test_folder_holds_config_safetensors_and_tokenizer(tiny_folder: Path):
    names = {p.name for p in tiny_folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    hf_config = json.loads((tiny_folder / "config.json").read_text())
    assert hf_config["architectures"] == ["Qwen2ForCausalLM"]
    assert hf_config["vocab_size"] == len(VOCAB)
    assert hf_config["eos_token_id"] == VOCAB["<eos>"]
    generation_config = json.loads((tiny_folder / "generation_config.json").read_text())
    assert generation_config["eos_token_id"] == VOCAB["<eos>"]


def test_transformers_loads_the_folder_and_scores_a_prompt(tiny_folder: Path):
    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    ids = tokenizer("23+45=", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 6, len(VOCAB))
    assert torch.isfinite(logits).all()
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.slow  # imports vLLM
def test_vllm_tokenizer_loader_reads_the_folder(tiny_folder: Path):
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(tiny_folder)
    ids = tokenizer.encode("23+45=", add_special_tokens=False)
    assert ids == [VOCAB[c] for c in "23+45="]
    assert tokenizer.eos_token_id == VOCAB["<eos>"]
    assert tokenizer.decode(ids) == "23+45="


def test_same_config_reuses_the_cached_folder(cache_dir: Path, tiny_folder: Path):
    weights = tiny_folder / "model.safetensors"
    written_at = weights.stat().st_mtime_ns
    relabelled = TINY.model_copy(update={"size": "tiny-xs"})
    assert materialize_model(relabelled, cache_dir) == tiny_folder
    assert weights.stat().st_mtime_ns == written_at


def test_init_seed_changes_folder_and_weights(cache_dir: Path, tiny_folder: Path):
    other = materialize_model(TINY.model_copy(update={"init_seed": 1}), cache_dir)
    assert other != tiny_folder
    first = AutoModelForCausalLM.from_pretrained(tiny_folder).model.embed_tokens.weight
    second = AutoModelForCausalLM.from_pretrained(other).model.embed_tokens.weight
    assert not torch.equal(first, second)


def test_materialising_is_deterministic(tmp_path: Path, tiny_folder: Path):
    rebuilt = materialize_model(TINY, tmp_path)
    assert rebuilt.name == tiny_folder.name
    assert (rebuilt / "model.safetensors").read_bytes() == (tiny_folder / "model.safetensors").read_bytes()


def test_hf_source_returns_its_folder_unchanged(tiny_folder: Path, tmp_path: Path):
    config = ModelConfig(source="hf", path=tiny_folder, size="tiny")
    assert materialize_model(config, tmp_path) == tiny_folder
    assert list(tmp_path.iterdir()) == []
