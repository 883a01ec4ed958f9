"""LearnerGroup: two DeepSpeed ranks as Ray actors (gloo), ZeRO-2, global token selection."""

import os
import socket

import psutil
import pytest
import ray
import torch
from ray.util.placement_group import placement_group, remove_placement_group
from transformers import Qwen2Config, Qwen2ForCausalLM

from workers.learner.batch import TrainBatch
from workers.learner.config import LearnerConfig
from workers.learner.engine import LearnerEngine, init_process_group
from workers.learner.group import LearnerGroup
from workers.learner.losses import PolicyLossConfig
from workers.learner.selection import SelectionConfig
from workers.rendezvous import LOOPBACK, free_address
from workers.weights.sync import gather_weights

pytestmark = pytest.mark.slow

VOCAB = 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_qwen2_group")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
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
            responses.append(torch.randint(1, VOCAB, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist())
            group_ids.append(group)
    return TrainBatch.from_lists(prompts, responses, torch.randn(len(prompts), generator=g), group_ids, pad_id=0)


def rank_parameters(group: LearnerGroup) -> list[dict[str, torch.Tensor]]:
    """Each rank's own module parameters (ZeRO-2 keeps a full replica on every rank)."""
    read = lambda engine: {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    return ray.get([actor.__ray_call__.remote(read) for actor in group.actors])


def test_two_rank_group_trains_like_one_process(model_dir, embedded_ray, tmp_path):
    learner = LearnerConfig(num_actors=2, zero_stage=2, lr=1e-3, mini_batch_size=16, micro_batch_size=4)
    loss = PolicyLossConfig(kl_coef=0.05)
    batch = make_batch()
    bundles = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK")
    ray.get(bundles.ready())
    group = LearnerGroup(model_dir, learner, loss, SelectionConfig(method="ets", ratio=0.5, scope="global"),
                         use_reference=True, placement_group=bundles, bundle_offset=0)
    try:
        # One machine: the ranks met on loopback, where rank 0's store listens and nowhere else; the weight-sync
        # store will listen there too.
        def rendezvous_listeners(engine) -> tuple[str, set[str]]:  # nested: Ray pickles it by value
            port = int(os.environ["MASTER_PORT"])
            return os.environ["MASTER_ADDR"], {conn.laddr.ip for conn in psutil.net_connections(kind="inet")
                                               if conn.pid == os.getpid() and conn.status == psutil.CONN_LISTEN
                                               and conn.laddr.port == port}

        addr, listening = ray.get(group.actors[0].__ray_call__.remote(rendezvous_listeners))
        assert addr == LOOPBACK and listening == {LOOPBACK}, (addr, listening)
        sync_host, _, _ = ray.get(group.actors[0].__ray_call__.remote(lambda engine: free_address()))
        assert sync_host == LOOPBACK

        prepared = group.compute_reference_stats(batch)
        assert prepared.batch_size == batch.batch_size and prepared.ref_logp is not None
        # One call per rank: each scores π_old / π_ref on its own shard (kl_coef > 0) and compares π_old with
        # the sampling logprobs the batch carries (here the group's own π_old: they must agree).
        metrics = group.train_step(batch.replace(sampling_logp=prepared.old_logp), step=0)
        assert metrics["rollout/logprob_diff"] < 1e-6
        assert metrics["optim/steps"] == 1
        # scope='global': ⌈ρ·N⌉ of all tokens of both ranks' micro-batches, not of each rank alone
        assert metrics["selection/selected_fraction"] == pytest.approx(0.5, abs=0.1)

        replicas = rank_parameters(group)
        for name, tensor in replicas[0].items():
            assert torch.equal(tensor, replicas[1][name]), name
        # The route to the engines: rank 0's weights as an ObjectRef, never through the driver's memory.
        state = {name: tensor.clone() for name, tensor in ray.get(gather_weights(group.actors))}
        assert set(state) == set(replicas[0])
        assert all(torch.equal(state[name], replicas[0][name]) for name in state)

        group.save_checkpoint(tmp_path / "ckpt", {"step": 1})
        group.train_step(prepared, step=1)
        assert group.load_checkpoint(tmp_path / "ckpt") == {"step": 1}
        restored = dict(ray.get(gather_weights(group.actors)))
        assert all(torch.equal(restored[name], state[name]) for name in state)

        # The same gradient as one process on the whole batch: DeepSpeed averages over ranks and the
        # engine's loss scale undoes that exactly. Scope 'group' for this, so that both runs rank the
        # same populations; the norm is measured before clipping and the optimiser step.
        def use_group_scope(engine):
            engine.selection = SelectionConfig(method="ets", ratio=0.5, scope="group")

        ray.get([actor.__ray_call__.remote(use_group_scope) for actor in group.actors])
        two_ranks = group.train_step(prepared, step=2)["optim/grad_norm"]
        one_process = _one_process_grad_norm(model_dir, learner, loss, prepared, weights=state)
        assert two_ranks == pytest.approx(one_process, rel=1e-4)

        # Token-budget micro-batches on two ranks (each rank packs its own shard, then both run as many
        # micro-batches as the busier one): the same gradient again, from the same weights.
        def use_token_budget(engine):
            engine.learner = engine.learner.model_copy(update={"max_tokens_per_micro_batch": 64})

        ray.get([actor.__ray_call__.remote(use_token_budget) for actor in group.actors])
        group.load_checkpoint(tmp_path / "ckpt")  # back to the weights of `state`
        packed = group.train_step(prepared, step=2)
        assert packed["optim/grad_norm"] == pytest.approx(one_process, rel=1e-4)
    finally:
        group.shutdown()
        remove_placement_group(bundles)


def _one_process_grad_norm(model_dir, learner, loss, prepared, weights) -> float:
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
