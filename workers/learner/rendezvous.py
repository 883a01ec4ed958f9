"""Where a learner rank joins its process group: light on purpose (no torch, DeepSpeed or transformers).

``LearnerGroup`` finds rank 0's port with a Ray task running :func:`free_address`; Ray imports the
function's module in the task's worker, so a function living beside the engine cost every run a
second import of torch + DeepSpeed + transformers (≈ 8 s of CPU on 2 cores) before the learner
actor could even start.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Rendezvous:
    """Where a Ray learner rank joins its group: set when the engine runs as ``LearnerActor``."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    threads: int  # torch intra-op threads: the CPU is shared with the rollout and reward actors


def free_address() -> tuple[str, int]:
    """This node's address and a free port on it (a rank 0 MASTER_ADDR/MASTER_PORT, or a weight-sync store)."""
    import ray  # only actors need Ray; the engine and its tests do not

    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    return ray.util.get_node_ip_address(), port
