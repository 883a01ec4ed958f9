"""The one model forward the learner runs: logits at the response tokens only (the engine and SFT call it)."""

from __future__ import annotations

import torch
from torch import nn


def response_logits(causal_lm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Logits [N, V] at the given (row, position) pairs only.

    Runs the decoder for the hidden states and applies the output layer at the N response
    positions instead of at all B·L positions (64.5 s → 42.5 s per step
    measured at SmolLM2's 49k vocabulary). Valid for models whose logits are ``lm_head(hidden)`` (Qwen2, Llama/SmolLM2);
    models that post-process logits (softcapping, logit scales) would need that step here too.
    """
    hidden = causal_lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return causal_lm.get_output_embeddings()(hidden.last_hidden_state[rows, positions])
