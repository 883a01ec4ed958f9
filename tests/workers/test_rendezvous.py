"""Where ranks meet: on one machine, loopback only (the store rank 0 serves and the gloo pairs alike)."""

import multiprocessing
import os
import socket
from datetime import timedelta

import psutil
import pytest
import torch

from workers.rendezvous import LOOPBACK, listening_store, pin_gloo_to


def _listening(pid: int) -> set[str]:
    return {conn.laddr.ip for conn in psutil.net_connections(kind="inet")
            if conn.pid == pid and conn.status == psutil.CONN_LISTEN}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def _other_rank(port: int, results) -> None:
    os.environ.pop("GLOO_SOCKET_IFNAME", None)
    store = listening_store(LOOPBACK, port, 2, False, timedelta(seconds=60))
    pin_gloo_to(LOOPBACK)
    torch.distributed.init_process_group("gloo", store=store, rank=1, world_size=2)
    total = torch.ones(1)
    torch.distributed.all_reduce(total)
    results.put((float(total), _listening(os.getpid())))
    torch.distributed.barrier()  # rank 0 lists its sockets while this one still holds its pair open
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_a_group_on_loopback_listens_on_loopback_only(monkeypatch) -> None:
    """torch's own TCPStore, given 127.0.0.1, still listens on every interface, and gloo on the address the
    hostname resolves to: both ranks here listen on 127.0.0.1 and nowhere else."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")  # recorded, so that what pin_gloo_to sets is undone after
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    port = _free_port()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    other = context.Process(target=_other_rank, args=(port, results))
    other.start()
    try:
        store = listening_store(LOOPBACK, port, 2, True, timedelta(seconds=60))
        pin_gloo_to(LOOPBACK)
        assert os.environ["GLOO_SOCKET_IFNAME"] in psutil.net_if_addrs()
        torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=2)
        total = torch.ones(1)
        torch.distributed.all_reduce(total)
        other_total, other_listening = results.get(timeout=120)
        mine = _listening(os.getpid())
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    finally:
        other.join(timeout=60)
        if other.is_alive():
            other.kill()
    assert float(total) == other_total == 2.0
    assert mine == {LOOPBACK}, mine  # the store and this rank's gloo pair
    assert other_listening <= {LOOPBACK}, other_listening


def test_gloo_is_pinned_only_on_loopback_and_never_over_a_users_choice(monkeypatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    pin_gloo_to("192.0.2.7")  # a routable address: the cluster's own setting decides
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    pin_gloo_to(LOOPBACK)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"


def test_a_store_refuses_a_port_already_taken_on_its_host() -> None:
    with socket.create_server((LOOPBACK, 0)) as taken:
        with pytest.raises(OSError):
            listening_store(LOOPBACK, taken.getsockname()[1], 1, True, timedelta(seconds=5))
