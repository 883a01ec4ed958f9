"""``gmts up`` / ``down`` / ``status`` without a Ray head: ports, refusals, and stopping a real process
family by its record. The whole stack, started and stopped, is test_readme_quickstart.py's."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from api import local_stack
from api.cli import main
from tests.api.support import free_port


def test_ports_come_from_flags_then_env_then_defaults(monkeypatch) -> None:
    monkeypatch.setenv("GMTS_PORT", "9001")
    monkeypatch.setenv("GMTS_RAY_DASHBOARD_PORT", "9002")
    ports = local_stack.Ports.from_env(api=None, mlflow=None, ray=7000, ray_dashboard=None)
    assert (ports.api, ports.mlflow, ports.ray, ports.ray_dashboard) == (9001, 5000, 7000, 9002)


def test_a_busy_port_is_refused_before_anything_starts(gmts_home: Path, capsys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        status = main(["up", "--port", str(free_port()), "--mlflow-port", str(free_port()), "--ray-port",
                       str(free_port()), "--ray-dashboard-port", str(port)])
    err = capsys.readouterr().err
    assert status == 1
    assert f"port {port} (Ray dashboard) is in use by another process" in err and "GMTS_RAY_DASHBOARD_PORT" in err
    assert json.loads((gmts_home / "stack.json").read_text()) == {"home": str(gmts_home)}  # nothing started
    assert (gmts_home.stat().st_mode & 0o777) == 0o700
    assert sorted(p.name for p in gmts_home.iterdir()) == ["logs", "stack.json"]


def test_an_existing_cluster_that_does_not_answer_is_named(gmts_home: Path, capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["up", "--ray-address", url]) == 1
    assert f"the Ray cluster at {url} does not answer as expected: ConnectError" in capsys.readouterr().err


def test_down_and_status_without_a_stack(gmts_home: Path, capsys) -> None:
    assert main(["down"]) == 0
    assert "nothing to stop" in capsys.readouterr().out
    assert main(["status"]) == 1
    assert capsys.readouterr().out.count("stopped") == 3
    assert main(["env"]) == 1
    assert "start it with `gmts up`" in capsys.readouterr().err


FAMILY = """
import os, subprocess, sys, time
# a child in its own session (as Ray starts job drivers) and one that ignores SIGTERM
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
print("ready", flush=True)
time.sleep(300)
"""


@pytest.mark.slow
def test_down_stops_the_recorded_process_its_group_and_every_descendant(gmts_home: Path, tmp_path: Path,
                                                                         capsys) -> None:
    gmts_home.mkdir(mode=0o700)
    (gmts_home / "logs").mkdir(mode=0o700)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # ours, not the stack's
    try:
        record = local_stack._start("ray", [sys.executable, "-c", FAMILY], gmts_home / "logs" / "ray.log", {})
        deadline = time.monotonic() + 60
        while "ready" not in Path(record["log"]).read_text()[record["log_offset"]:]:  # after the header line
            assert time.monotonic() < deadline, Path(record["log"]).read_text()
            time.sleep(0.1)
        family = psutil.Process(record["pid"]).children(recursive=True)
        assert len(family) == 2
        record["url"] = f"http://127.0.0.1:{free_port()}"  # where nothing answers
        local_stack._write_stack(gmts_home, {"home": str(gmts_home), "ray": record})
        assert main(["status"]) == 1  # the "Ray head" runs but does not answer on any port
        assert "not answering" in capsys.readouterr().out
        started = time.monotonic()
        assert main(["down"]) == 0
        assert "Ray head: stopped (3 process(es)" in capsys.readouterr().out
        assert time.monotonic() - started < 60
        assert not psutil.pid_exists(record["pid"]) and not any(p.is_running() for p in family)
        assert bystander.poll() is None
        assert json.loads((gmts_home / "stack.json").read_text()) == {"home": str(gmts_home)}
    finally:
        bystander.kill()
        bystander.wait()


def test_a_recorded_pid_that_now_belongs_to_another_process_is_left_alone(gmts_home: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        record = {"part": "api", "pid": other.pid, "pgid": other.pid, "log": "-",
                  "create_time": psutil.Process(other.pid).create_time() - 100}  # a process started earlier
        assert local_stack._stop_part(record) == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
