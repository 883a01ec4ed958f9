"""The tiny policy: a randomly initialised Qwen2ForCausalLM over the character vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from workers.models.char_tokenizer import VOCAB, save_char_tokenizer
from workers.models.config import FOLDER_DTYPE, ModelConfig

if TYPE_CHECKING:
    from transformers import Qwen2Config


def tiny_qwen2_config(config: ModelConfig) -> Qwen2Config:
    from transformers import Qwen2Config  # see write_tiny_model

    tokenizer_ids = {
        "pad_token_id": VOCAB["<pad>"],
        "bos_token_id": VOCAB["<bos>"],
        "eos_token_id": VOCAB["<eos>"],
    }
    return Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        dtype=FOLDER_DTYPE,
        **tokenizer_ids,
    )


def write_tiny_model(config: ModelConfig, folder: Path) -> None:
    """Write config, safetensors weights, generation config and the character tokenizer into ``folder``."""
    # Imported here: every run's driver imports this module, and the Qwen2 classes (its config too) cost it seconds
    # that only a folder's first build needs.
    from transformers import GenerationConfig, Qwen2ForCausalLM

    qwen2_config = tiny_qwen2_config(config)
    # fork_rng: seeding must not disturb the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.init_seed)
        model = Qwen2ForCausalLM(qwen2_config)
    model.save_pretrained(folder)
    # vLLM stops on generation_config's eos_token_id as well as the tokenizer's; keep the two in agreement.
    GenerationConfig(
        bos_token_id=qwen2_config.bos_token_id,
        eos_token_id=qwen2_config.eos_token_id,
        pad_token_id=qwen2_config.pad_token_id,
    ).save_pretrained(folder)
    save_char_tokenizer(folder)
