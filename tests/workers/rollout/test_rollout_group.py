"""Two real Ray rollout actors sharing prompts and receiving one broadcast weight update."""

import copy
import os
from pathlib import Path

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from workers.models.char_tokenizer import VOCAB
from workers.rollout.actor import RolloutGroup
from workers.rollout.config import RolloutConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
PROMPTS = [[VOCAB[c] for c in text] for text in ("1+1=", "2+2=", "3+3=", "4+4=", "5+5=")]


@pytest.fixture(scope="module")
def group(tiny_model_dir):
    # Actors import `workers` from the repository, whether or not the package is installed.
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": python_path}})
    group = RolloutGroup(tiny_model_dir, RolloutConfig(num_actors=2, max_new_tokens=8), num_cpus_per_actor=1)
    yield group
    group.shutdown()
    ray.shutdown()


@pytest.mark.slow
def test_group_splits_prompts_and_keeps_their_order(group):
    samples = group.generate(PROMPTS, n=3)
    assert [s.prompt_index for s in samples] == [i for i in range(len(PROMPTS)) for _ in range(3)]
    assert all(s.prompt_ids == PROMPTS[s.prompt_index] for s in samples)
    assert all(len(s.response_logprobs) == len(s.response_ids) for s in samples)


@pytest.mark.slow
def test_weight_update_reaches_every_actor(group, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    new_model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in new_model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)

    seconds = group.update_weights(new_model.state_dict())
    assert len(seconds) == 2 and all(0 < s < 5 for s in seconds)

    # The same prompt four times: actor 0 answers the first two, actor 1 the last two.
    prompt = PROMPTS[0]
    samples = group.generate([prompt] * 4, n=1, greedy=True)
    ids = torch.tensor([prompt + samples[0].response_ids])
    with torch.no_grad():
        new_argmax = new_model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
        old_argmax = model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
    assert new_argmax != old_argmax, "the perturbation should change the greedy path"
    assert all(s.response_ids == new_argmax for s in samples)
