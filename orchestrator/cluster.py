"""Connect to a Ray cluster, or start an embedded one (the default on a laptop / this machine)."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

# Set per actor (``actor_runtime_env``), not in ray.init: inside a Ray job, a runtime_env given to
# ray.init would replace the job's own (its working_dir), while per-actor env_vars merge with it.
# vLLM in-process on CPU (engine start ≈4.5 s instead of ≈31 s, workers/rollout/README.md), and no tokenizer
# thread pools fighting the actors for 2 cores.
ACTOR_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}


def actor_runtime_env() -> dict:
    return {"env_vars": dict(ACTOR_ENV)}


# Ray's switch for a cluster of one machine (meant for macOS and Windows, honoured on Linux): the node's address is
# loopback, so GCS, raylet, workers and agents listen on 127.0.0.1 only; otherwise Ray turns even an explicit
# ``_node_ip_address="127.0.0.1"`` into the interface address and its gRPC servers listen on every interface.
# Such a node accepts no other node: a cluster of several hosts is started with `ray start` (docs/deploy.md).
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def start_embedded(**init_kwargs) -> None:
    """Start Ray on this machine alone, every server of it on loopback (``ray.init(address="local")``: a cluster of
    our own, never attached to another local one). ``init_kwargs`` go to ``ray.init``."""
    import ray  # here, not at the top: the control plane reads LOCAL_ONLY_ENV without importing Ray

    loopback_only()
    ray.init(address="local", **init_kwargs)


def loopback_only() -> None:
    """Every Ray node this process starts from now on (``ray.init``, or the several nodes of Ray's own
    ``cluster_utils.Cluster``) serves on 127.0.0.1 only."""
    from ray._private import ray_constants

    os.environ[LOCAL_ONLY_ENV] = "0"  # the processes it starts (GCS, raylet, workers, job drivers) inherit it
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process read the variable when it imported Ray


def connect(address: str | None = None) -> None:
    """Use the Ray that is already up (Ray job, Tune trial), else ``address``/``RAY_ADDRESS``, else
    an embedded local cluster."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("Connecting to Ray at %s", address)
        ray.init(address=address)
    else:
        logger.info("Starting an embedded local Ray (no address given)")
        start_embedded(include_dashboard=False)
