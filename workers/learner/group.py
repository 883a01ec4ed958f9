"""N learner actors that train as one data-parallel DeepSpeed group (OpenRLHF-style actor group).

Each rank is ``LearnerActor = ray.remote(LearnerEngine)``, as ``RolloutActor = ray.remote(RolloutEngine)``:
no forwarding layer. Rendezvous: a zero-CPU task on rank 0's node (its placement bundle, else the node
rank 0 is then pinned to) picks a free port there; every rank's constructor joins the process group
with it at once (``init_process_group`` blocks until all have joined).
Data: a TrainBatch is cut into one equal shard of whole prompt groups per rank, and crosses to the
learners once per step: ``train_step`` computes π_old / π_ref on each shard itself when the schedule
or KL needs them. Each rank runs the same PPO schedule and DeepSpeed averages the gradients, so the
update is that of the whole batch.
Placement: with a placement group, rank r sits in bundle ``bundle_offset + r`` (see
``orchestrator.resources``), so a sweep trial's actors stay inside its placement group.
Weights leave the ranks through ``workers.weights.sync.WeightSync``, which calls ``actors`` itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from workers.learner.batch import TrainBatch
from workers.learner.checkpoint_files import files_under, write_files
from workers.learner.config import LearnerConfig
from workers.learner.engine import LearnerEngine
from workers.learner.rendezvous import Rendezvous
from workers.rendezvous import free_address
from workers.learner.losses import PolicyLossConfig
from workers.learner.schedule import shard
from workers.learner.selection import SelectionConfig
from workers.placement import in_bundle

logger = logging.getLogger(__name__)

LearnerActor = ray.remote(LearnerEngine)


class LearnerGroup:
    def __init__(
        self,
        model_dir: str | Path,
        learner: LearnerConfig,
        loss: PolicyLossConfig,
        selection: SelectionConfig,
        temperature: float = 1.0,
        use_reference: bool = False,
        placement_group: PlacementGroup | None = None,
        bundle_offset: int = 0,
        num_cpus_per_actor: float = 1.0,
        num_gpus_per_actor: float = 0.0,
        runtime_env: dict | None = None,
    ):
        """Spawn ``learner.num_actors`` ranks (the config is the one source of the group size: it also
        sets each rank's share of the mini-batch) and build their engines."""
        self.num_actors = learner.num_actors
        self._nodes: list[str] | None = None  # each rank's Ray node, once a node_local checkpoint asks
        placements = [in_bundle(placement_group, bundle_offset + rank) for rank in range(self.num_actors)]
        probe = ray.remote(free_address).options(num_cpus=0, **placements[0])
        master_addr, master_port, master_node = ray.get(probe.remote())
        if placement_group is None:  # rank 0 must listen where the port was found free
            placements[0] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=master_node, soft=False)}
        self.actors = [
            LearnerActor.options(num_cpus=num_cpus_per_actor, num_gpus=num_gpus_per_actor, runtime_env=runtime_env,
                                 **placements[rank])
            .remote(str(model_dir), learner, loss, selection, temperature=temperature, use_reference=use_reference,
                    rendezvous=Rendezvous(rank, self.num_actors, master_addr, master_port, learner.threads_per_actor))
            for rank in range(self.num_actors)
        ]
        self.init_seconds = max(ray.get([actor.__ray_call__.remote(lambda engine: engine.init_seconds)
                                         for actor in self.actors]))
        logger.info("learner group of %d ready at %s:%d in %.1f s", self.num_actors, master_addr, master_port,
                    self.init_seconds)

    def _on_all(self, method: str, *args) -> list:
        return ray.get([getattr(actor, method).remote(*args) for actor in self.actors])

    def _on_shards(self, method: str, batch: TrainBatch, *args) -> list:
        shards = shard(batch, self.num_actors)
        return ray.get([getattr(actor, method).remote(shard, *args) for actor, shard in zip(self.actors, shards)])

    def compute_reference_stats(self, batch: TrainBatch) -> TrainBatch:
        """The batch with ``old_logp``/``ref_logp``, rows in shard order (whole groups, groups in order).
        For evaluation's comparisons with the base; the update computes its own in ``train_step``."""
        return TrainBatch.concat(self._on_shards("compute_reference_stats", batch))

    def train_step(self, batch: TrainBatch, step: int) -> dict[str, float]:
        """One update on ``batch`` (one call per rank, π_old / π_ref computed there when needed); metrics
        are the mean over ranks (timings: the slowest rank), ``rollout/logprob_diff`` included."""
        per_rank = self._on_shards("train_step", batch, step)
        metrics: dict[str, float] = {}
        for key in sorted(set().union(*per_rank)):
            values = [m[key] for m in per_rank if key in m]
            metrics[key] = max(values) if key.startswith("time/") else sum(values) / len(values)
        return metrics

    def save_checkpoint(self, path: str | Path, client_state: dict | None = None, *, node_local: bool = False) -> None:
        """Every rank writes its part under ``path``; ``node_local``: the parts written on other nodes than the
        caller's are then brought to ``path`` here, so that the caller's folder holds the whole checkpoint."""
        self._on_all("save_checkpoint", str(path), client_state)
        if node_local:
            away = self._one_rank_per_other_node()
            for files in ray.get([actor.__ray_call__.remote(_files_under, str(path)) for actor in away]):
                write_files(path, files)

    def load_checkpoint(self, path: str | Path, *, node_local: bool = False) -> dict:
        """``node_local``: the caller's folder is first copied to the other nodes (one object-store copy)."""
        away = self._one_rank_per_other_node() if node_local else []
        if away:
            files = ray.put(files_under(path))
            ray.get([actor.__ray_call__.remote(_write_files, str(path), files) for actor in away])
        return self._on_all("load_checkpoint", str(path))[0]

    def _one_rank_per_other_node(self) -> list:
        """A rank on each node other than the caller's: the ranks of one node share its disk, so one of them
        sends (or receives) that node's files."""
        if self._nodes is None:  # an actor never moves: ask once
            self._nodes = ray.get([actor.__ray_call__.remote(_node_id) for actor in self.actors])
        here = ray.get_runtime_context().get_node_id()
        by_node: dict[str, object] = {}
        for node, actor in zip(self._nodes, self.actors):
            if node != here:
                by_node.setdefault(node, actor)
        return list(by_node.values())

    def token_statistics(self, batch: TrainBatch) -> list[dict]:
        """Per-answer token entropy, G and ω (see LearnerEngine.token_statistics), answers in shard order."""
        return [answer for shard in self._on_shards("token_statistics", batch) for answer in shard]

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


# Run inside a rank through ``__ray_call__`` (the engine's own methods stay free of Ray and of file transfers).
def _node_id(engine: LearnerEngine) -> str:
    return ray.get_runtime_context().get_node_id()


def _files_under(engine: LearnerEngine, path: str) -> dict[str, bytes]:
    return files_under(path)


def _write_files(engine: LearnerEngine, path: str, files: dict[str, bytes]) -> None:
    write_files(path, files)
