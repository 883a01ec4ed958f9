"""Where ranks meet: the address of a rendezvous, and stores and gloo groups that listen there only.

Light on purpose (no torch, DeepSpeed or transformers at import): ``LearnerGroup`` runs :func:`free_address`
as a Ray task, and Ray imports the function's module in the task's worker; a function living beside the
engine cost every run a second import of torch + DeepSpeed + transformers (≈ 8 s of CPU on 2 cores).

On one machine every rendezvous listens on loopback: torch's own ``TCPStore`` listens on every interface and
gloo on the address the hostname resolves to, so :func:`listening_store` and :func:`pin_gloo_to` say where.
On a cluster of several hosts the address is the node's Ray address (``ray start --node-ip-address``: the
cluster's own setting). Ray's own servers listen on the node's address: loopback for the embedded cluster
(``orchestrator.cluster.start_embedded``; docs/deploy.md, "Security first").
"""

from __future__ import annotations

import ipaddress
import os
import socket
from datetime import timedelta

LOOPBACK = "127.0.0.1"


def rendezvous_host() -> str:
    """Loopback when every alive Ray node is on this machine (no rank needs to reach it from outside), else this
    node's Ray address. Call it inside a Ray task or actor."""
    import ray  # only actors need Ray; the engine and its tests do not

    this_node = ray.get_runtime_context().get_node_id()
    alive = [node for node in ray.nodes() if node["Alive"]]
    own = next(node["NodeManagerAddress"] for node in alive if node["NodeID"] == this_node)
    return LOOPBACK if all(node["NodeManagerAddress"] == own for node in alive) else own


def free_address() -> tuple[str, int, str]:
    """Where rank 0 will listen (a MASTER_ADDR/MASTER_PORT, or a weight-sync store): the rendezvous host, a
    port free there, and the Ray node it is on."""
    import ray

    host = rendezvous_host()
    with socket.socket(_family(host)) as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    return host, port, ray.get_runtime_context().get_node_id()


def listening_store(host: str, port: int, world_size: int, is_master: bool, timeout: timedelta):
    """A ``TCPStore`` whose master listens on ``host`` only (given ``host``, torch's own still listens on every
    interface): the master hands torch a socket it bound itself."""
    import torch.distributed as dist

    if not is_master:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    listener = socket.create_server((host, port), family=_family(host))
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, master_listen_fd=listener.detach())


def pin_gloo_to(host: str) -> None:
    """On loopback, make gloo listen there too: unless ``GLOO_SOCKET_IFNAME`` names an interface (a user's
    setting wins), gloo binds the address this machine's hostname resolves to, often a routable one."""
    if "GLOO_SOCKET_IFNAME" in os.environ or not ipaddress.ip_address(host).is_loopback:
        return
    import psutil

    for interface, addresses in psutil.net_if_addrs().items():
        if any(address.address == host for address in addresses):
            os.environ["GLOO_SOCKET_IFNAME"] = interface
            return


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
