"""Two real Ray rollout actors sharing prompts and receiving one broadcast weight update."""

import copy
import os

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from workers.models.char_tokenizer import VOCAB
from workers.rollout.actor import RolloutGroup
from workers.rollout.config import RolloutConfig
from workers.weights.object_store import HostWeights
from workers.weights.sync import load_into_engines

PROMPTS = [[VOCAB[c] for c in text] for text in ("1+1=", "2+2=", "3+3=", "4+4=", "5+5=")]


@pytest.fixture(scope="module")
def group(tiny_model_dir, embedded_ray):
    group = RolloutGroup(tiny_model_dir, RolloutConfig(num_actors=2, max_new_tokens=8, threads_per_actor=2), num_cpus_per_actor=1)
    yield group
    group.shutdown()


@pytest.mark.slow
def test_group_splits_prompts_and_keeps_their_order(group):
    samples = group.generate(PROMPTS, n=3)
    assert [s.prompt_index for s in samples] == [i for i in range(len(PROMPTS)) for _ in range(3)]
    assert all(s.prompt_ids == PROMPTS[s.prompt_index] for s in samples)
    assert all(len(s.response_logprobs) == len(s.response_ids) for s in samples)


@pytest.mark.slow
def test_each_engine_computes_at_its_configured_threads(group):
    # Ray would give a 1-CPU actor one thread (OMP_NUM_THREADS=1); the config asks for 2.
    threads = ray.get([actor.__ray_call__.remote(lambda engine: torch.get_num_threads()) for actor in group.actors])
    assert threads == [2, 2]


@pytest.mark.slow
def test_weight_update_reaches_every_actor(group, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    new_model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in new_model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)

    seconds = load_into_engines(group.actors, new_model.state_dict())
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


@pytest.mark.slow
def test_host_weights_cross_the_object_store_intact_and_are_mapped_not_copied(group):
    tensors = {
        "fp32": torch.randn(3, 5),
        "bf16": torch.randn(4, 2).to(torch.bfloat16),  # NumPy has no bfloat16: travels as bytes
        "int64": torch.arange(6).reshape(2, 3),
        "strided": torch.randn(4, 6)[:, ::2],  # non-contiguous input
        "scalar": torch.tensor(2.5),
    }
    packed = HostWeights(tensors.items())
    assert len(packed) == 5 and packed.nbytes == sum(t.numel() * t.element_size() for t in tensors.values())

    def read_in_actor(weights):
        # The arrays as the reader got them: read-only means mapped from the object store's shared memory,
        # not unpickled into a copy (what Ray does with the bytes of a plain torch tensor).
        mapped = [not data.flags.writeable for *_, data in weights._entries]
        return [(name, tensor.clone()) for name, tensor in weights], mapped

    reader = ray.remote(read_in_actor).options(num_cpus=0)  # the engines hold both CPUs
    returned, mapped = ray.get(reader.remote(ray.put(packed)))
    assert [name for name, _ in returned] == list(tensors)
    for name, tensor in returned:
        assert tensor.dtype == tensors[name].dtype and torch.equal(tensor, tensors[name]), name
    assert all(mapped)


@pytest.mark.slow
def test_shutdown_leaves_no_rendezvous_file_behind(group):
    """Last in the module: it ends the module's group. Killed without stopping, each engine would leave its
    rendezvous file in the temp folder (one per run; hundreds accumulate)."""
    # vLLM's uni-process executor joins its world of one through a FileStore in the temp folder.
    def rendezvous_file(engine) -> str:
        import torch.distributed as dist

        return dist.distributed_c10d._get_default_store().underlying_store.path

    files = ray.get([actor.__ray_call__.remote(rendezvous_file) for actor in group.actors])
    assert len(set(files)) == 2 and all(os.path.exists(path) for path in files)
    group.shutdown()
    assert group.actors == []
    assert not [path for path in files if os.path.exists(path)]
