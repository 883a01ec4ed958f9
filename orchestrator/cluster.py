"""Connect to a Ray cluster, or start an embedded one (the default on a laptop / this machine)."""

from __future__ import annotations

import logging
import os

import ray

logger = logging.getLogger(__name__)

# Set per actor (``actor_runtime_env``), not in ray.init: inside a Ray job, a runtime_env given to
# ray.init would replace the job's own (its working_dir), while per-actor env_vars merge with it.
# vLLM in-process on CPU (engine start ≈4.5 s instead of ≈31 s, workers/rollout/README.md), and no tokenizer
# thread pools fighting the actors for 2 cores.
ACTOR_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}


def actor_runtime_env() -> dict:
    return {"env_vars": dict(ACTOR_ENV)}


def connect(address: str | None = None) -> None:
    """Use the Ray that is already up (Ray job, Tune trial), else ``address``/``RAY_ADDRESS``, else
    an embedded local cluster."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("Connecting to Ray at %s", address)
        ray.init(address=address)
    else:
        logger.info("Starting an embedded local Ray (no address given)")
        ray.init(address="local", include_dashboard=False)  # never a stale cluster from /tmp/ray
