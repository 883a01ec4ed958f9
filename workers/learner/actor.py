"""One learner rank as a Ray actor: joins the learners' process group, then drives a LearnerEngine.

A plain class; :class:`workers.learner.group.LearnerGroup` wraps it with ``ray.remote`` and the
resources (and placement-group bundle) of each rank. Ray gives every GPU actor its own
``CUDA_VISIBLE_DEVICES``, so each rank sees one device, ``cuda:0``, and ``LOCAL_RANK`` is 0.
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch

from workers.host_weights import HostWeights
from workers.learner.batch import TrainBatch
from workers.learner.config import LearnerConfig
from workers.learner.engine import LearnerEngine, init_process_group
from workers.learner.losses import PolicyLossConfig
from workers.learner.selection import SelectionConfig
from workers.weight_broadcast import WeightBroadcastGroup, join_group, local_device_key


class LearnerActor:
    def __init__(self, rank: int, world_size: int, threads: int):
        # Ray sets OMP_NUM_THREADS=1 for actors that ask for one CPU; be explicit either way, the CPU
        # is shared with the rollout and reward actors (RECIPES.md: contention costs 3–40×).
        torch.set_num_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.engine: LearnerEngine | None = None
        self.weight_group: WeightBroadcastGroup | None = None  # rank 0, collective weight sync only

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port on it; rank 0's becomes MASTER_ADDR/MASTER_PORT."""
        import ray  # only actors need Ray; the engine and its tests do not

        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int, model_dir: str | Path, learner: LearnerConfig,
              loss: PolicyLossConfig, selection: SelectionConfig, temperature: float, use_reference: bool) -> float:
        """Join the process group (a collective: all ranks at once) and build the engine; returns its init seconds."""
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
        init_process_group(self.rank, self.world_size, master_addr, master_port, local_rank=0)
        self.engine = LearnerEngine(model_dir, learner, loss, selection, temperature=temperature,
                                    use_reference=use_reference)
        return self.engine.init_seconds

    def weight_sync_device(self) -> str | None:
        return local_device_key()

    def join_weight_sync_group(self, host: str, port: int, world_size: int, backend: str) -> None:
        """Rank 0 only: create the weight-sync group at its own address as rank 0 (the TCPStore master)."""
        self.weight_group = join_group(host, port, 0, world_size, backend)

    def broadcast_weights(self, bucket_bytes: int) -> int:
        return self.engine.broadcast_weights(self.weight_group, bucket_bytes)

    def compute_reference_stats(self, batch: TrainBatch) -> TrainBatch:
        return self.engine.compute_reference_stats(batch)

    def train_step(self, batch: TrainBatch, step: int) -> dict[str, float]:
        return self.engine.train_step(batch, step)

    def weights_for_rollout(self) -> HostWeights:
        """``LearnerEngine.state_dict_for_inference`` packed for the object store (empty on ranks other than 0)."""
        return HostWeights(self.engine.state_dict_for_inference().items())

    def save_checkpoint(self, path: str, client_state: dict | None = None) -> None:
        self.engine.save_checkpoint(path, client_state)

    def load_checkpoint(self, path: str) -> dict:
        return self.engine.load_checkpoint(path)

    def token_statistics(self, batch: TrainBatch) -> list[dict]:
        return self.engine.token_statistics(batch)

    def sequence_logprobs(self, prompt_ids: list[int], response_ids: list[int],
                          temperature: float | None = None) -> list[float]:
        return self.engine.sequence_logprobs(prompt_ids, response_ids, temperature)
