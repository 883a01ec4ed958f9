"""LearnerGroup: two DeepSpeed ranks as Ray actors (gloo), ZeRO-2, global token selection, on two nodes.

The nodes are Ray's multi-node harness (``ray.cluster_utils.Cluster``: each node its own raylet and object store,
all on 127.0.0.1 of this machine), so the rendezvous, the gradient all-reduce, the weights' route and the
checkpoint's file transfers (``node_local``) cross nodes. One machine has one disk: that a node cannot read another's
files is not shown here (the transfer's helpers: tests/sweeps/test_checkpoint_travel.py).
"""

import os

import psutil
import pytest
import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, remove_placement_group

from orchestrator.cluster import loopback_only
from tests.workers.learner.tiny_learner import make_batch, one_process_grad_norm, rank_parameters, write_model
from workers.learner.config import LearnerConfig
from workers.learner.group import LearnerGroup
from workers.learner.losses import PolicyLossConfig
from workers.learner.selection import SelectionConfig
from workers.rendezvous import LOOPBACK, free_address
from workers.weights.sync import gather_weights

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("tiny_qwen2_group"))


@pytest.fixture(scope="module")
def two_nodes():
    ray.shutdown()  # the suite's shared embedded Ray, were it up: this module needs a cluster of its own
    loopback_only()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_two_rank_group_trains_like_one_process(model_dir, two_nodes, tmp_path):
    learner = LearnerConfig(num_actors=2, zero_stage=2, lr=1e-3, mini_batch_size=16, micro_batch_size=4)
    loss = PolicyLossConfig(kl_coef=0.05)
    batch = make_batch()
    bundles = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    ray.get(bundles.ready())
    group = LearnerGroup(model_dir, learner, loss, SelectionConfig(method="ets", ratio=0.5, scope="global"),
                         use_reference=True, placement_group=bundles, bundle_offset=0)
    try:
        nodes = ray.get([actor.__ray_call__.remote(lambda engine: ray.get_runtime_context().get_node_id())
                         for actor in group.actors])
        assert len(set(nodes)) == 2 and ray.get_runtime_context().get_node_id() not in nodes, \
            "the ranks shared a node, or sat on the driver's"
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

        # node_local: every rank's part is brought to this process's folder, and the folder back to them at load.
        group.save_checkpoint(tmp_path / "ckpt", {"step": 1}, node_local=True)
        saved = {path.relative_to(tmp_path / "ckpt").as_posix() for path in (tmp_path / "ckpt").rglob("*.pt")}
        assert {f"learner/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(2)} <= saved, saved
        group.train_step(prepared, step=1)
        assert group.load_checkpoint(tmp_path / "ckpt", node_local=True) == {"step": 1}
        restored = dict(ray.get(gather_weights(group.actors)))
        assert all(torch.equal(restored[name], state[name]) for name in state)

        # The same gradient as one process on the whole batch: DeepSpeed averages over ranks and the
        # engine's loss scale undoes that exactly. Scope 'group' for this, so that both runs rank the
        # same populations; the norm is measured before clipping and the optimiser step.
        def use_group_scope(engine):
            engine.selection = SelectionConfig(method="ets", ratio=0.5, scope="group")

        ray.get([actor.__ray_call__.remote(use_group_scope) for actor in group.actors])
        two_ranks = group.train_step(prepared, step=2)["optim/grad_norm"]
        one_process = one_process_grad_norm(model_dir, learner, loss, prepared, weights=state)
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
