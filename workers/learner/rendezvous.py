"""Where a Ray learner rank joins its group (the address itself: ``workers/rendezvous.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rendezvous:
    """Where a Ray learner rank joins its group: set when the engine runs as ``LearnerActor``."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    threads: int  # torch intra-op threads: the CPU is shared with the rollout and reward actors
