"""The weight route that CUDA engines take: worker processes, bytes through collective_rpc.

On CPU the same route runs when vLLM's multiprocessing is on (engine core and worker in their own
processes), so this test exercises the worker extension end to end without a GPU.
"""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from workers.models.char_tokenizer import VOCAB
from workers.rollout.config import RolloutConfig
from workers.rollout.engine import RolloutEngine

PROMPT = [VOCAB[c] for c in "23+45="]


@pytest.fixture
def multiprocess_engine(tiny_model_dir, monkeypatch, tmp_path):
    import vllm.envs

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    # The engine core's ZMQ sockets are files named by UUID in this folder, and vLLM leaves them behind at
    # shutdown: here they go with the test's tmp_path instead of piling up in /tmp.
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))
    # An in-process engine made earlier in this process froze vLLM's env-var cache; re-read the variable.
    vllm.envs.disable_envs_cache()
    engine = RolloutEngine(tiny_model_dir, RolloutConfig(max_new_tokens=12))
    yield engine
    engine.shutdown()
    vllm.envs.disable_envs_cache()


@pytest.mark.slow
def test_weights_reach_a_worker_process(multiprocess_engine, tiny_model_dir):
    assert multiprocess_engine._in_process_worker() is None  # so update_weights takes the bytes route
    assert multiprocess_engine.weight_sync_route() == "bytes"  # what 'auto' picks for it on CPU

    new_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    old_model = copy.deepcopy(new_model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in new_model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    assert multiprocess_engine.update_weights(new_model.state_dict()) < 5

    (greedy,) = multiprocess_engine.generate([PROMPT], n=1, greedy=True)
    ids = torch.tensor([PROMPT + greedy.response_ids])
    with torch.no_grad():
        new_argmax = new_model(ids).logits[0, len(PROMPT) - 1 : -1].argmax(-1).tolist()
        old_argmax = old_model(ids).logits[0, len(PROMPT) - 1 : -1].argmax(-1).tolist()
    assert new_argmax != old_argmax, "the perturbation should change the greedy path"
    assert greedy.response_ids == new_argmax
