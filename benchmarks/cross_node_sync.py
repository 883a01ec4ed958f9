"""What the weight sync moves between nodes: SmolLM2-135M's weights through Ray's object store, other node vs same.

On the ``in_process`` / ``bytes`` routes learner rank 0 puts its full weights in its node's object store once
(``HostWeights``) and every engine reads them (``workers/weights/sync.py``): an engine on rank 0's node maps that
copy, an engine on another node pulls it over the network first. This times that leg alone, on Ray's multi-node
harness (``ray.cluster_utils.Cluster``: a head and two worker nodes, each its own raylet and object store, all on
127.0.0.1 of this machine), for the state dict the learner sends at SmolLM2-135M's shapes in fp32 (tied
embeddings sent twice, as the learner sends them), filled with seeded random values: the bytes, not the model,
are under test. Loopback is the best case of a network: a real one adds its own bandwidth limit.

``--smoke`` runs a 1-layer, 64-wide state dict once.
"""

from __future__ import annotations

import statistics
import time

from benchmarks.report import BenchmarkResult, Figure


def smollm2_shapes(layers: int = 30, hidden: int = 576, intermediate: int = 1536, vocab: int = 49152,
                   kv_width: int = 3 * 64) -> dict[str, tuple[int, ...]]:
    """SmolLM2-135M's inference state dict (HF names): 30 layers, hidden 576, 9 query / 3 key-value heads of 64."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden),
                                          "lm_head.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    layer_shapes = {"self_attn.q_proj.weight": (hidden, hidden), "self_attn.k_proj.weight": (kv_width, hidden),
                    "self_attn.v_proj.weight": (kv_width, hidden), "self_attn.o_proj.weight": (hidden, hidden),
                    "mlp.gate_proj.weight": (intermediate, hidden), "mlp.up_proj.weight": (intermediate, hidden),
                    "mlp.down_proj.weight": (hidden, intermediate), "input_layernorm.weight": (hidden,),
                    "post_attention_layernorm.weight": (hidden,)}
    for layer in range(layers):
        shapes.update({f"model.layers.{layer}.{name}": shape for name, shape in layer_shapes.items()})
    return shapes


def run(smoke: bool) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.cluster import loopback_only

    shapes = smollm2_shapes(layers=1, hidden=64, intermediate=128, vocab=512, kv_width=32) if smoke \
        else smollm2_shapes()
    rounds = 1 if smoke else 5
    loopback_only()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        for node in ("learner_node", "engine_node"):
            cluster.add_node(num_cpus=1, resources={node: 1}, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        seconds, size = _time_pushes(shapes, rounds)
    finally:
        ray.shutdown()
        cluster.shutdown()
    figures = [Figure("bytes per push (learner rank 0 → each engine)", round(size / 1e6, 1), "MB",
                      f"{len(shapes)} tensors, fp32")]
    for where, values in seconds.items():
        median = statistics.median(values)
        figures.append(Figure(f"{where}: seconds per push", round(median, 3), "s",
                              f"{size / median / 1e9:.2f} GB/s; median of {len(values)} after 1 discarded"))
    figures.append(Figure("other node ÷ same node", round(statistics.median(seconds["other node"])
                                                          / statistics.median(seconds["same node"]), 1), "×"))
    return BenchmarkResult(
        title="the weight sync's object-store leg across nodes (Ray's multi-node harness, loopback)",
        settings={"tensors": len(shapes), "bytes": size, "rounds": rounds, "warmup_rounds": 1,
                  "nodes": "head (0 CPU) + 2 worker nodes of 1 CPU, 127.0.0.1"},
        figures=figures, measurements={k: [round(v, 4) for v in vs] for k, vs in seconds.items()},
        notes=["same node: the engine maps the learner's copy (no bytes move); other node: Ray's object manager pulls "
               "the whole object to the engine's node before the call runs (as load_into_engines passes it)."],
    ).as_dict()


def _time_pushes(shapes: dict[str, tuple[int, ...]], rounds: int) -> tuple[dict[str, list[float]], int]:
    import ray

    learner = ray.remote(num_cpus=0)(_Learner).options(resources={"learner_node": 0.5}).remote(shapes)
    engines = {"other node": ray.remote(num_cpus=0)(_Engine).options(resources={"engine_node": 0.5}).remote(),
               "same node": ray.remote(num_cpus=0)(_Engine).options(resources={"learner_node": 0.5}).remote()}
    seconds: dict[str, list[float]] = {where: [] for where in engines}
    size = 0
    for round_ in range(rounds + 1):
        for where, engine in engines.items():
            weights = learner.weights_for_rollout.remote()
            ray.wait([weights], fetch_local=False)  # packed and sealed on the learner's node before timing starts
            started = time.perf_counter()
            size = ray.get(engine.update_weights.remote(weights))
            if round_:
                seconds[where].append(time.perf_counter() - started)
            del weights
    return seconds, size


class _Learner:
    """Stands in for ``LearnerEngine.weights_for_rollout``: the same ``HostWeights`` of the same shapes."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.shapes = shapes

    def weights_for_rollout(self):
        import torch

        from workers.weights.object_store import HostWeights

        generator = torch.Generator().manual_seed(0)
        return HostWeights((name, torch.randn(shape, generator=generator)) for name, shape in self.shapes.items())


class _Engine:
    """Stands in for ``RolloutEngine.update_weights`` up to the reload: takes the weights, reads each tensor's size."""

    def update_weights(self, weights) -> int:
        return sum(tensor.numel() * tensor.element_size() for _, tensor in weights)
