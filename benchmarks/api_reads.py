"""API reads under load: 50 concurrent clients on loopback while a sweep runs, and time to /healthz.

    python -m benchmarks.api_reads [--smoke] [--out DIR]      (standalone, like reward_integrity)

Everything real and on loopback: a Ray head with token authentication (own temp dir and ports), the
API as a ``gmts serve`` process (MLflow: its default SQLite store in the state dir), and the
``cpu-smoke`` sweep submitted through ``POST /v1/sweeps`` and running on the head (so the two
cores are busy with its trials, as a user's would be, and the reconciler works on every pass).
Then 50 asyncio clients each issue ``GET /v1/sweeps`` and ``GET /v1/sweeps/{id}`` in turn; the
figures are the p50/p99 of those latencies, and the seconds from starting ``gmts serve`` to the
first 200 of ``/healthz`` — on a fresh state dir, and again after a restart with the sweep running.
The load runs twice, from aiohttp clients (the target figure) and then from httpx ones: measured, an
httpx request costs its client ≈ 30× the CPU of an aiohttp one (4.6 vs 0.15 ms), more than the server
spends on it, so on 2 shared cores 50 httpx clients mostly measure their own queue. Each library's
client CPU per request is reported beside the server's.

``--nice-cluster`` lowers the priority of the Ray head and everything under it (the sweep's driver
and trial actors), and not of the API or the clients, so that a shared machine's rule "run under
nice -n 19" can be kept for the sweep without measuring a niced server. Linux groups CPU time by
session ("autogroups", /proc/sys/kernel/sched_autogroup_enabled): a plain nice value only orders the
processes of one session, and Ray starts job drivers in sessions of their own, so the benchmark sets
the nice value of each of those processes *and* of its session's autogroup (/proc/PID/autogroup),
again every second while the load runs (trials start actors on the way).

Targets: p99 ≤ 200 ms, /healthz ≤ 5 s. Unlike the other benchmarks these are absolute
times, because the targets are: they depend on the machine's load (recorded in the report).
Everything started here is stopped here, by process group and recorded descendants (never
``ray stop``, which would stop other users' clusters too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.ray_session import REPO_ROOT
from benchmarks.report import BenchmarkResult, Figure, require_modules

logger = logging.getLogger(__name__)

VENV_BIN = Path(sys.executable).parent
CLIENTS = 50
TARGET_P99_MS = 200.0
TARGET_HEALTHZ_S = 5.0
CLIENT_LIBRARIES = ("aiohttp", "httpx")  # the first one's p99 is the target figure


def settings_for(smoke: bool, nice_cluster: int = 0) -> dict:
    return {"clients": CLIENTS, "requests_per_client": 4 if smoke else 20, "spec": "cpu-smoke",
            "endpoints": ["GET /v1/sweeps", "GET /v1/sweeps/{id}"], "client_libraries": list(CLIENT_LIBRARIES),
            "reconcile_interval_s": 5,
            "cluster_nice": nice_cluster}


def run(smoke: bool, nice_cluster: int = 0) -> dict:
    require_modules("api.app", "ray.job_submission", "httpx", "aiohttp")
    import psutil

    cfg = settings_for(smoke, nice_cluster)
    work = Path(tempfile.mkdtemp(prefix="gmts-br-", dir="/tmp"))  # short: Ray's socket paths
    started: list[subprocess.Popen] = []
    token = "bench-" + secrets.token_hex(16)
    try:
        ray_url = _start_ray_head(work, token, started)
        head = psutil.Process(started[-1].pid)
        api = _Api(work, token, ray_url, started)
        healthz_fresh, ready_fresh = api.start()
        sweep = api.post("/v1/sweeps", _cpu_smoke()).json()
        _wait(lambda: api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "running", 600, "the sweep to run")
        api.stop()
        healthz_restart, ready_restart = api.start()  # the records and the running sweep are there now
        server = psutil.Process(api.proc.pid)
        load_before = os.getloadavg()
        phases = {}
        with _Deprioritised(head, nice_cluster):
            # The same load twice, from the two client libraries: the first is the headline; the second
            # shows how much of a latency is the load generator's own queue (httpx costs ≈ 30×
            # aiohttp's CPU per request, and the clients share the 2 cores with the server and the sweep).
            for library in CLIENT_LIBRARIES:
                cpu_before = sum(server.cpu_times()[:2])
                phases[library] = asyncio.run(_load(api.url, token, sweep["id"], cfg["clients"],
                                                    cfg["requests_per_client"], library))
                phases[library]["server_cpu_s"] = sum(server.cpu_times()[:2]) - cpu_before  # reconciler too
            sequential = asyncio.run(_load(api.url, token, sweep["id"], 1, 50))["all"]
        status_after = api.get(f"/v1/sweeps/{sweep['id']}").json()["status"]
        api.post(f"/v1/sweeps/{sweep['id']}/cancel", {})
    finally:
        for proc in reversed(started):
            _stop(proc)
        if not os.environ.get("GMTS_BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    figures = []
    for library, phase in phases.items():
        ms = sorted(1000 * x for x in phase["all"])
        p99 = _percentile(ms, 99)
        label = f"{cfg['clients']} concurrent {library} clients, GET list + get"
        headline = library == CLIENT_LIBRARIES[0]
        figures += [
            Figure(f"p50 latency, {label}", _percentile(ms, 50), "ms"),
            Figure(f"p99 latency, {label}", p99, "ms",
                   f"target ≤ {TARGET_P99_MS:.0f} ms: {'met' if p99 <= TARGET_P99_MS else 'MISSED'}" if headline
                   else "the same load from the heavier client library: context, not the target"),
            Figure(f"max latency, {library} clients", ms[-1], "ms"),
            Figure(f"server CPU per request, {library} load (user + system, reconciler included)",
                   1000 * phase["server_cpu_s"] / len(ms), "ms",
                   "× 50 concurrent requests ≈ the queueing delay with one core to itself"),
            Figure(f"load generator CPU per request, {library} clients", 1000 * phase["client_cpu_s"] / len(ms), "ms",
                   "the clients' own cost, on the same 2 cores"),
            Figure(f"errors (non-200 answers), {library} clients", phase["errors"], ""),
        ]
    figures += [
        Figure("p50 latency, 1 client, sequential", _percentile(sorted(1000 * x for x in sequential), 50), "ms"),
        Figure("gmts serve start → first /healthz 200 (fresh state)", healthz_fresh, "s",
               f"target ≤ {TARGET_HEALTHZ_S:.0f} s: {'met' if healthz_fresh <= TARGET_HEALTHZ_S else 'MISSED'}"),
        Figure("gmts serve restart → first /healthz 200 (a sweep running)", healthz_restart, "s",
               f"target ≤ {TARGET_HEALTHZ_S:.0f} s: {'met' if healthz_restart <= TARGET_HEALTHZ_S else 'MISSED'}"),
        Figure("gmts serve start → first /readyz 200 (app imported, Ray and MLflow answer)", ready_fresh, "s",
               "not a target: the app's imports (request models, MLflow) run behind the listening server"),
        Figure("gmts serve restart → first /readyz 200", ready_restart, "s"),
    ]
    per_endpoint = {f"{library}/{name}": {"n": len(values), "p50_ms": _percentile(sorted(1000 * v for v in values), 50),
                                          "p99_ms": _percentile(sorted(1000 * v for v in values), 99)}
                    for library, phase in phases.items() for name, values in phase.items() if name in ("list", "get")}
    return BenchmarkResult(
        title="API reads: 50 concurrent clients on loopback while the cpu-smoke sweep runs; time to /healthz",
        settings=cfg,
        figures=figures,
        measurements={"requests_per_library": len(phases[CLIENT_LIBRARIES[0]]["all"]),
                      "server_cpu_seconds": {library: phase["server_cpu_s"] for library, phase in phases.items()},
                      "client_cpu_seconds": {library: phase["client_cpu_s"] for library, phase in phases.items()},
                      "per_endpoint": per_endpoint, "sweep_status_after_load": status_after,
                      "load_average_before": load_before, "load_average_after": os.getloadavg()},
        notes=["absolute times (the targets are absolute); the machine's load average is recorded",
               "the sweep's trials run on the same cores as the API and the clients"],
    ).as_dict()


async def _load(url: str, token: str, sweep_id: str, clients: int, per_client: int,
                library: str = "aiohttp") -> dict[str, list[float] | int | float]:
    """``clients`` concurrent clients in this process's event loop, each ``per_client`` requests in turn.
    ``client_cpu_s``: this process's CPU time over the load (the load generator's own cost)."""
    if library not in CLIENT_LIBRARIES:
        raise ValueError(f"library: {library!r} is not one of {CLIENT_LIBRARIES}")
    results: dict = {"all": [], "list": [], "get": [], "errors": 0}
    headers = {"Authorization": f"Bearer {token}"}
    if library == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(url, headers=headers, timeout=aiohttp.ClientTimeout(total=60),
                                        connector=aiohttp.TCPConnector(limit=clients))

        async def get(path: str) -> int:
            async with session.get(path) as response:
                await response.read()
                return response.status
    elif library == "httpx":
        import httpx

        session = httpx.AsyncClient(base_url=url, headers=headers, timeout=60,
                                    limits=httpx.Limits(max_connections=clients, max_keepalive_connections=clients))

        async def get(path: str) -> int:
            return (await session.get(path)).status_code

    async def client(index: int) -> None:
        for n in range(per_client):
            name, path = ("list", "/v1/sweeps") if (index + n) % 2 == 0 else ("get", f"/v1/sweeps/{sweep_id}")
            start = time.perf_counter()
            status = await get(path)
            elapsed = time.perf_counter() - start
            results["errors"] += status != 200
            results[name].append(elapsed)
            results["all"].append(elapsed)

    cpu_before = time.process_time()
    try:
        await asyncio.gather(*(client(i) for i in range(clients)))
    finally:
        await (session.close() if library == "aiohttp" else session.aclose())
    results["client_cpu_s"] = time.process_time() - cpu_before
    return results


class _Deprioritised:
    """While inside: every second, ``nice`` for ``root`` and all its descendants and their sessions'
    autogroups (see the module docstring); nice 0 does nothing."""

    def __init__(self, root, nice: int) -> None:
        self.root, self.nice = root, nice
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> None:
        if self.nice:
            self._apply()
            self.thread.start()

    def __exit__(self, *exc) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def _loop(self) -> None:
        while not self.done.wait(1.0):
            self._apply()

    def _apply(self) -> None:
        import psutil

        try:
            family = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in family:
            try:
                if proc.nice() < self.nice:
                    proc.nice(self.nice)
                Path(f"/proc/{proc.pid}/autogroup").write_text(str(self.nice))
            except (psutil.Error, OSError):
                pass  # gone meanwhile, or no autogroups on this kernel


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n q / 100)
    return sorted_values[int(rank) - 1]


def _cpu_smoke() -> dict:
    import yaml

    return yaml.safe_load((REPO_ROOT / "sweeps" / "specs" / "cpu-smoke.yaml").read_text())


class _Api:
    """``gmts serve`` as its own process, started from the repository like a user would."""

    def __init__(self, work: Path, token: str, ray_url: str, started: list[subprocess.Popen]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token, self.work, self.started = token, work, started
        (work / "token").write_text(token)
        (work / "token").chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_", "GMTS_"))}
        self.env = {**env, "GMTS_API_TOKEN_FILE": str(work / "token"), "GMTS_STATE_DIR": str(work / "state"),
                    "GMTS_RAY_ADDRESS": ray_url, "GMTS_RAY_AUTH_TOKEN_FILE": str(work / "token"),
                    "GMTS_PORT": str(self.port), "GMTS_CANCEL_WAIT_S": "60"}
        self.proc: subprocess.Popen | None = None

    def start(self) -> tuple[float, float]:
        """Seconds from the process start to the first 200 of /healthz, and of /readyz."""
        import httpx

        begin = time.monotonic()
        with open(self.work / "api.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "api.cli", "serve"], env=self.env, cwd=REPO_ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.started.append(self.proc)
        times = []
        for path in ("/healthz", "/readyz"):
            last = "no answer"
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError((self.work / "api.log").read_text()[-3000:])
                try:
                    response = httpx.get(f"{self.url}{path}", timeout=30)
                    if response.status_code == 200:
                        times.append(time.monotonic() - begin)
                        break
                    last = f"{response.status_code} {response.text[:300]}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                if time.monotonic() - begin > 900:
                    raise RuntimeError(f"gmts serve did not answer {path} within 900 s (last: {last})")
                time.sleep(0.05)
        return times[0], times[1]

    def stop(self) -> None:
        _stop(self.proc)
        self.started.remove(self.proc)

    def get(self, path: str):
        import httpx

        return httpx.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {self.token}"}, timeout=120)

    def post(self, path: str, body: dict):
        import httpx

        response = httpx.post(f"{self.url}{path}", json=body, headers={"Authorization": f"Bearer {self.token}"},
                              timeout=120)
        if response.status_code >= 400:
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:500]}")
        return response


def _start_ray_head(work: Path, token: str, started: list[subprocess.Popen]) -> str:
    import httpx

    dashboard = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_", "GMTS_"))}
    # TMPDIR inside the run's folder, as `gmts up` does: the dashboard's forkserver leaves its pymp-* there.
    scratch = work / "tmp"
    scratch.mkdir(mode=0o700, exist_ok=True)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, PATH=f"{VENV_BIN}:{env['PATH']}",
               RAY_USAGE_STATS_ENABLED="0", TMPDIR=str(scratch))
    ports = [arg for flag in ("--port", "--ray-client-server-port", "--dashboard-agent-listen-port",
                              "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port",
                              "--node-manager-port", "--object-manager-port") for arg in (flag, str(_free_port()))]
    args = [str(VENV_BIN / "ray"), "start", "--head", "--block", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard), "--include-dashboard", "true",
            "--temp-dir", str(work / "ray"), "--disable-usage-stats", *ports]
    with open(work / "ray-head.log", "ab") as log:
        proc = subprocess.Popen(args, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    started.append(proc)
    url = f"http://127.0.0.1:{dashboard}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError((work / "ray-head.log").read_text()[-3000:])
        try:
            return httpx.get(f"{url}/api/version", headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    _wait(up, 300, "the Ray head")
    return url


def _stop(proc: subprocess.Popen | None) -> None:
    """SIGTERM the process group, then SIGKILL it and every descendant recorded before (Ray starts job
    drivers in sessions of their own)."""
    import psutil

    if proc is None or proc.poll() is not None:
        return
    try:
        family = [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid, *family]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.api_reads", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="4 requests per client instead of 20")
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    parser.add_argument("--nice-cluster", type=int, default=0, choices=range(0, 20), metavar="0-19",
                        help="nice value of the Ray cluster (the sweep), not of the API or the clients")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    result = run(args.smoke, args.nice_cluster)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"api_reads{'-smoke' if args.smoke else ''}.json").write_text(text)
    for figure in result["figures"]:
        print(f"{figure['name']}: {figure['value']:.4g} {figure['unit']} {figure['detail']}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
