"""What the learner tests share: a tiny Qwen2 model folder, a random batch, each rank's parameters, and the
gradient norm of one process on the whole batch (the reference two ranks must match)."""

import socket

import ray
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from workers.learner.batch import TrainBatch
from workers.learner.engine import LearnerEngine, init_process_group
from workers.learner.group import LearnerGroup
from workers.learner.selection import SelectionConfig

VOCAB = 20


def write_model(folder, seed: int = 1):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=128, vocab_size=VOCAB)
        Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


def make_batch(groups=4, group_size=4, seed=0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    prompts, responses, group_ids = [], [], []
    for group in range(groups):
        prompt = torch.randint(1, VOCAB, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for _ in range(group_size):
            prompts.append(prompt)
            length = int(torch.randint(2, 9, (1,), generator=g))
            responses.append(torch.randint(1, VOCAB, (length,), generator=g).tolist())
            group_ids.append(group)
    return TrainBatch.from_lists(prompts, responses, torch.randn(len(prompts), generator=g), group_ids, pad_id=0)


def rank_parameters(group: LearnerGroup) -> list[dict[str, torch.Tensor]]:
    """Each rank's own module parameters (ZeRO-2 keeps a full replica on every rank)."""
    read = lambda engine: {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    return ray.get([actor.__ray_call__.remote(read) for actor in group.actors])


def one_process_grad_norm(model_dir, learner, loss, prepared, weights) -> float:
    """One LearnerEngine of world size 1 on the whole batch, in a worker process of its own: this test process may
    hold the process group and DeepSpeed's cached groups of a test before it."""
    @ray.remote(num_cpus=0, max_calls=1)  # the placement group holds both CPUs; the worker exits after
    def one_process() -> float:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        init_process_group(rank=0, world_size=1, master_addr="127.0.0.1", master_port=port)
        torch.set_num_threads(1)
        engine = LearnerEngine(model_dir, learner.model_copy(update={"num_actors": 1, "zero_stage": 0}), loss,
                               SelectionConfig(method="ets", ratio=0.5, scope="group"), use_reference=True)
        engine.model.load_state_dict(weights)
        return engine.train_step(prepared, step=2)["optim/grad_norm"]

    return ray.get(one_process.remote())
