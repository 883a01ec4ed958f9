"""``gmts up`` / ``down`` / ``status`` / ``env``: the whole service on one machine, on loopback.

``up`` starts what is missing of three parts — a Ray head with token authentication, an MLflow
tracking server (SQLite store) and the API (``gmts serve``) — waits until each answers, and records
what it started in ``<home>/stack.json``; ``down`` stops exactly those processes, by the pid and
process group recorded there, never by name: ``ray stop`` would end every Ray cluster of this user.

Everything lives in one owner-only folder, ``$GMTS_HOME`` or ``~/.local/share/gmts-lab``:

    stack.json        what runs: pids, process groups, ports, URLs, token files (0600)
    api-token         the API's bearer token; ray-token: the Ray cluster's (0600, generated once)
    api/              the API's state dir (its default): api.db, jobs/, runs/
    mlflow.db, mlartifacts/   the MLflow server's store
    logs/             one log per process: ray.log, mlflow.log, api.log
    ray/              Ray's temp dir, when its path is short enough for unix sockets
    tmp/              the Ray head's TMPDIR (beside ray/): emptied and removed when the head stops

Children run with umask 077, so what they write under the folder is owner-only too.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from api.settings import CODE_DIR, DEFAULT_MODEL_CACHE
from orchestrator.cluster import LOCAL_ONLY_ENV

HOME_ENV = "GMTS_HOME"
DEFAULT_HOME = Path("~/.local/share/gmts-lab")
PARTS = ("ray", "mlflow", "api")
TITLES = {"ray": "Ray head", "mlflow": "MLflow server", "api": "API"}
# Ray puts unix sockets under <temp dir>/session_<date>_<time>_<µs>_<pid>/sockets/plasma_store: 61
# characters after the temp dir, and a socket path may have at most 107.
MAX_RAY_TEMP_DIR_CHARS = 107 - 62


class StackError(Exception):
    """``up`` could not bring a part up (its log named), or ``down`` could not end a process."""


@dataclass
class Ports:
    api: int = 8000
    mlflow: int = 5000
    ray: int = 6379
    ray_dashboard: int = 8265

    @classmethod
    def from_env(cls, **flags: int | None) -> Ports:
        """Flags win, then GMTS_PORT, GMTS_MLFLOW_PORT, GMTS_RAY_PORT, GMTS_RAY_DASHBOARD_PORT."""
        ports = cls()
        for name, value in flags.items():
            env = os.environ.get("GMTS_PORT" if name == "api" else f"GMTS_{name.upper()}_PORT")
            chosen = value if value is not None else (int(env) if env else getattr(ports, name))
            setattr(ports, name, chosen)
        return ports


def stack_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser().absolute()


def read_stack(home: Path | None = None) -> dict[str, Any] | None:
    """The record of ``gmts up`` in ``home`` (default: ``stack_home()``), or None when there is none."""
    path = (home or stack_home()) / "stack.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------- up


def up(*, ports: Ports, ray_address: str | None = None, ray_token_file: Path | None = None,
       tracking_uri: str | None = None, timeout: float = 600.0, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Start what is missing, wait until every part answers, and return the stack's record."""
    home = _private_dir(stack_home())
    logs = _private_dir(home / "logs")
    stack = read_stack(home) or {}
    stack["home"] = str(home)
    notes: dict[str, str] = {}
    started: list[str] = []
    try:
        _choose_ray(stack, ray_address, ray_token_file, notes)
        _choose_mlflow(stack, tracking_uri, notes)
        _choose_api(stack, notes)
        launches = [part for part in PARTS if stack.get(part) is None]
        _check_ports(launches, ports)
        for part in launches:  # side by side: each start is seconds to a minute of imports
            stack[part] = _LAUNCH[part](home, logs, ports, stack)
            started.append(part)
            _write_stack(home, stack)
        for part in launches:
            stack[part] = _WAIT[part](stack, home, logs, ports, timeout)
            notes[part] = f"started (pid {stack[part]['pid']})"
            _write_stack(home, stack)
    except BaseException:
        for part in reversed(started):  # a failed `up` leaves nothing of its own running
            _stop_part(stack.get(part))
            stack.pop(part, None)
        _write_stack(home, stack)
        raise
    _say_summary(stack, notes, say)
    return stack


def _choose_ray(stack: dict, address: str | None, token_file: Path | None, notes: dict) -> None:
    """Keep a healthy Ray head of ours or the named cluster; None = start one."""
    ray = stack.get("ray")
    if address:
        if ray and not ray.get("external") and _alive(ray):
            raise StackError(f"this stack's own Ray head runs (pid {ray['pid']}): `gmts down` it before "
                             f"using --ray-address {address}")
        ray = {"external": True, "url": address.rstrip("/"),
               "token_file": str(Path(token_file).expanduser().absolute()) if token_file else None}
    if ray and ray.get("external"):
        problem = _ray_problem(ray)
        if problem:
            raise StackError(f"the Ray cluster at {ray['url']} does not answer as expected: {problem}")
        stack["ray"], notes["ray"] = ray, "existing cluster"
        return
    stack["ray"] = _keep_if_healthy(ray, _ray_problem, notes)


def _choose_mlflow(stack: dict, tracking_uri: str | None, notes: dict) -> None:
    mlflow = stack.get("mlflow")
    if tracking_uri:
        if mlflow and not mlflow.get("external") and _alive(mlflow):
            raise StackError(f"this stack's own MLflow server runs (pid {mlflow['pid']}): `gmts down` it before "
                             f"using --tracking-uri {tracking_uri}")
        web = tracking_uri.startswith(("http://", "https://"))
        mlflow = {"external": True, "url": tracking_uri.rstrip("/") if web else tracking_uri,
                  "ui_url": tracking_uri.rstrip("/") if web else None}
    if mlflow and mlflow.get("external"):
        problem = _mlflow_problem(mlflow)
        if problem:
            raise StackError(f"the MLflow tracking server at {mlflow['url']} does not answer: {problem}")
        stack["mlflow"], notes["mlflow"] = mlflow, "existing server"
        return
    stack["mlflow"] = _keep_if_healthy(mlflow, _mlflow_problem, notes)


def _choose_api(stack: dict, notes: dict) -> None:
    api = stack.get("api")
    # An API started against another Ray or MLflow than the stack's now is restarted with the new ones.
    if api and stack["ray"] and stack["mlflow"] and (
            api.get("ray_address") != stack["ray"]["url"] or api.get("tracking_uri") != stack["mlflow"]["url"]):
        _stop_part(api)
        api = None
    if api and (stack["ray"] is None or stack["mlflow"] is None):
        _stop_part(api)  # its Ray or MLflow is about to be replaced
        api = None
    stack["api"] = _keep_if_healthy(api, _api_problem, notes)


def _keep_if_healthy(record: dict | None, problem: Callable[[dict], str | None], notes: dict) -> dict | None:
    """A recorded process of ours that is alive and answers is kept; one that is alive but does not
    answer is stopped (it is ours, by pid and start time) and counts as missing."""
    if record is None:
        return None
    if _alive(record) and problem(record) is None:
        notes[record["part"]] = f"already running (pid {record['pid']})"
        return record
    _stop_part(record)
    return None


def _check_ports(parts: list[str], ports: Ports) -> None:
    wanted = {"api": [("API", ports.api, "--port / GMTS_PORT")],
              "mlflow": [("MLflow", ports.mlflow, "--mlflow-port / GMTS_MLFLOW_PORT")],
              "ray": [("Ray GCS", ports.ray, "--ray-port / GMTS_RAY_PORT"),
                      ("Ray dashboard", ports.ray_dashboard, "--ray-dashboard-port / GMTS_RAY_DASHBOARD_PORT")]}
    for part in parts:
        for title, port, how in wanted[part]:
            if not _port_free(port):
                raise StackError(f"port {port} ({title}) is in use by another process; choose another with {how}")


def _port_free(port: int) -> bool:
    # Binding the wildcard address fails while anything listens on the port, on any address.
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


# ------------------------------------------------------------------------------------------ launch


def _launch_ray(home: Path, logs: Path, ports: Ports, stack: dict) -> dict:
    token_file = _token_file(home / "ray-token", secrets.token_hex(32))
    # Ray makes its temp dir and everything in it world-writable (it expects several users per node):
    # it lives inside an owner-only folder that nobody else can enter.
    temp_dir = home / "ray"
    if len(str(temp_dir)) > MAX_RAY_TEMP_DIR_CHARS:
        temp_dir = _private_dir(Path("/tmp") / f"gmts-{os.getuid()}-{secrets.token_hex(4)}") / "ray"
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    # LOCAL_ONLY_ENV: the node's address is loopback, so every Ray server of this one-machine stack listens there.
    # Python's temp files of every process under the head go into the stack's own folder: the dashboard's
    # multiprocessing forkserver makes a pymp-* folder there and is killed with the node, so its exit
    # handlers never remove it; beside ray/, so that its unix sockets' paths stay as short.
    scratch = _private_dir(temp_dir.parent / "tmp")
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file), RAY_USAGE_STATS_ENABLED="0",
               TMPDIR=str(scratch), **{LOCAL_ONLY_ENV: "0"})
    # Ray's side ports get free ones: their defaults (10001, 52365 …) belong to any other Ray cluster here.
    side_ports = ["--ray-client-server-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                  "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port"]
    args = [_tool("ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
            "--port", str(ports.ray), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports.ray_dashboard),
            "--include-dashboard", "true", "--num-cpus", str(os.cpu_count() or 1), "--temp-dir", str(temp_dir),
            "--disable-usage-stats", *[arg for flag, port in zip(side_ports, _free_ports(len(side_ports)))
                                        for arg in (flag, str(port))]]
    # Job drivers run in the head's working directory: the repository, where sweeps/ and orchestrator/ are.
    record = _start("ray", args, logs / "ray.log", env)
    record.update(url=f"http://127.0.0.1:{ports.ray_dashboard}", gcs_address=f"127.0.0.1:{ports.ray}",
                  token_file=str(token_file), temp_dir=str(temp_dir), scratch_dir=str(scratch))
    return record


def _launch_mlflow(home: Path, logs: Path, ports: Ports, stack: dict) -> dict:
    args = [_tool("mlflow"), "server", "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
            "--default-artifact-root", str(home / "mlartifacts"), "--host", "127.0.0.1",
            "--port", str(ports.mlflow), "--workers", "1"]
    # A tracking server only: MLflow's job runner (GenAI evaluation, prompt optimisation, online scorers) is
    # nothing a run uses, and at each start it spawns eight huey consumers (≈ 12 s of CPU and 1.4 GB on 2
    # cores) and a /dev/shm folder it never removes. Set the variable to "true" to have it anyway.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    record = _start("mlflow", args, logs / "mlflow.log", env)
    url = f"http://127.0.0.1:{ports.mlflow}"
    record.update(url=url, ui_url=url)
    return record


def _launch_api(home: Path, logs: Path, ports: Ports, stack: dict) -> dict:
    token_file = _token_file(home / "api-token", secrets.token_urlsafe(32))
    ray, mlflow = stack["ray"], stack["mlflow"]
    state_dir = home / "api"
    roots = [DEFAULT_MODEL_CACHE.expanduser(), state_dir]  # the model cache: the shipped presets warm up there
    roots += [Path(root) for root in os.environ.get("GMTS_ALLOWED_ROOTS", "").split(os.pathsep) if root]
    env = {key: value for key, value in os.environ.items()
           if key not in ("GMTS_API_TOKEN", "GMTS_RAY_AUTH_TOKEN", "GMTS_HOST", "GMTS_MLFLOW_UI_URL")}
    env.update(GMTS_API_TOKEN_FILE=str(token_file), GMTS_PORT=str(ports.api), GMTS_STATE_DIR=str(state_dir),
               GMTS_RAY_ADDRESS=ray["url"], GMTS_MLFLOW_TRACKING_URI=mlflow["url"],
               GMTS_ALLOWED_ROOTS=os.pathsep.join(str(root) for root in dict.fromkeys(roots)))
    env.pop("GMTS_RAY_AUTH_TOKEN_FILE", None)
    if ray.get("token_file"):
        env["GMTS_RAY_AUTH_TOKEN_FILE"] = ray["token_file"]
    if mlflow.get("ui_url"):
        env["GMTS_MLFLOW_UI_URL"] = mlflow["ui_url"]
    record = _start("api", [sys.executable, "-m", "api.cli", "serve"], logs / "api.log", env)
    record.update(url=f"http://127.0.0.1:{ports.api}", token_file=str(token_file), state_dir=str(state_dir),
                  ray_address=ray["url"], tracking_uri=mlflow["url"])
    return record


def _start(part: str, args: list[str], log: Path, env: dict[str, str]) -> dict:
    """A process in a session (and process group) of its own, detached from this one, logging to ``log``."""
    # The venv first on PATH: a Ray job's `python` is the first one on the head's PATH.
    env = {**env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])}
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as handle:
        handle.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} gmts up: {' '.join(args)}\n".encode())
        handle.flush()
        offset = handle.tell()
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                cwd=CODE_DIR, start_new_session=True, umask=0o077)
    proc.returncode = 0  # it outlives this command on purpose: no "still running" warning when it is dropped
    return {"part": part, "pid": proc.pid, "pgid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(),
            "log": str(log), "log_offset": offset, "args": args}


def _tool(name: str) -> str:
    """The venv's own script (the head's ``python`` is the one its jobs run), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise StackError(f"`{name}` is not installed next to {sys.executable} nor on PATH")
    return found


def _free_ports(count: int) -> list[int]:
    """``count`` different free ports (all held open while choosing, so none is chosen twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# -------------------------------------------------------------------------------------------- wait


def _wait_ray(stack: dict, home: Path, logs: Path, ports: Ports, timeout: float) -> dict:
    # On a loaded machine the raylet can miss Ray's fixed registration window and `ray start` exits
    # after the dashboard already answered: ready means "Ray runtime started" in its log too; a head
    # that died starting is started once more.
    record = stack["ray"]
    for attempt in (1, 2):
        try:
            return _wait(record, _ray_problem, timeout, _ray_runtime_started)
        except _Died:
            if attempt == 2:
                raise StackError(_failure(record, "exited while starting")) from None
            _stop_part(record)
            record = stack["ray"] = _launch_ray(home, logs, ports, stack)
            _write_stack(home, stack)
    raise AssertionError("unreachable")


def _ray_runtime_started(record: dict) -> bool:
    try:
        with open(record["log"], "rb") as handle:
            handle.seek(record["log_offset"])  # this start's lines only: the log keeps earlier starts'
            return b"Ray runtime started" in handle.read()
    except OSError:
        return False


def _wait_mlflow(stack: dict, home: Path, logs: Path, ports: Ports, timeout: float) -> dict:
    return _wait_simple(stack["mlflow"], _mlflow_problem, timeout)


def _wait_api(stack: dict, home: Path, logs: Path, ports: Ports, timeout: float) -> dict:
    return _wait_simple(stack["api"], _api_problem, timeout)


def _wait_simple(record: dict, problem: Callable[[dict], str | None], timeout: float) -> dict:
    try:
        return _wait(record, problem, timeout)
    except _Died:
        raise StackError(_failure(record, "exited while starting")) from None


class _Died(Exception):
    pass


def _wait(record: dict, problem: Callable[[dict], str | None], timeout: float,
          also: Callable[[dict], bool] = lambda record: True) -> dict:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not _alive(record):
            raise _Died
        last = problem(record) or ("" if also(record) else "still starting")
        if not last:
            return record
        time.sleep(1.0)
    raise StackError(_failure(record, f"did not answer within {timeout:.0f} s ({last})"))


def _failure(record: dict, what: str) -> str:
    tail = _tail(record, 2000).strip().splitlines()[-15:]
    return (f"the {TITLES[record['part']]} {what}; its log: {record['log']}\n"
            + "\n".join(f"  | {line}" for line in tail))


def _tail(record: dict, size: int) -> str:
    try:
        with open(record["log"], "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - size))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------- health


def _ray_problem(ray: dict) -> str | None:
    """The Jobs API answers a listing with our token (a 200 proves the dashboard up and the token right)."""
    headers = {}
    if ray.get("token_file"):
        headers["Authorization"] = f"Bearer {Path(ray['token_file']).read_text().strip()}"
    return _http_problem(f"{ray['url']}/api/jobs/", headers)


def _mlflow_problem(mlflow: dict) -> str | None:
    if not mlflow["url"].startswith(("http://", "https://")):
        return None  # a local store (sqlite:///…, a folder): nothing to ask
    return _http_problem(f"{mlflow['url']}/health")


def _api_problem(api: dict) -> str | None:
    return _http_problem(f"{api['url']}/readyz", timeout=30)


def _http_problem(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0) -> str | None:
    try:
        response = httpx.get(url, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__} from {url}"
    return None if response.status_code == 200 else f"HTTP {response.status_code} from {url}: {response.text[:200]}"


# ------------------------------------------------------------------------------------ down, status


def down(say: Callable[[str], None] = print) -> int:
    """Stop what ``up`` recorded, API first (it watches the others); returns how many parts were stopped."""
    home = stack_home()
    stack = read_stack(home)
    if not stack:
        say(f"nothing to stop: no {home / 'stack.json'}")
        return 0
    stopped = 0
    for part in reversed(PARTS):
        record = stack.get(part)
        if record is None or record.get("external"):
            stack.pop(part, None)
            continue
        pids = _stop_part(record)
        say(f"{TITLES[part]}: stopped" + (f" ({len(pids)} process(es): {', '.join(map(str, sorted(pids)))})"
                                           if pids else " (was not running)"))
        stopped += bool(pids)
        stack.pop(part)
        _write_stack(home, stack)
    return stopped


def _stop_part(record: dict | None, grace: float = 30.0) -> list[int]:
    """SIGTERM to the recorded process, up to ``grace`` seconds for it to end its own children, then
    SIGTERM to every process of its group and every descendant seen before or after (Ray starts job
    drivers in sessions of their own), 5 s, SIGKILL to what is left; checks that nothing of it is alive,
    then removes the part's scratch folder (its TMPDIR), which nothing of it can still be writing.

    The leader goes first because `ray start --block` shuts its node down in order within seconds,
    while gcs_server and raylet signalled directly wait out a drain period of their own."""
    if record is None or record.get("external"):
        return []
    family = {proc.pid: proc for proc in _family(record)}
    leader = _process(record)
    if leader is not None:
        _signal([leader], psutil.Process.terminate)
        psutil.wait_procs([leader], timeout=grace)
    family.update((proc.pid, proc) for proc in _family(record))
    rest = [proc for proc in family.values() if _running(proc)]
    _signal(rest, psutil.Process.terminate)
    _, alive = psutil.wait_procs(rest, timeout=5)
    _signal(alive, psutil.Process.kill)
    _, alive = psutil.wait_procs(alive, timeout=10)
    left = [proc.pid for proc in alive if _running(proc)]
    if left:
        raise StackError(f"the {TITLES[record['part']]}'s processes {left} survived SIGKILL")
    if record.get("scratch_dir"):
        shutil.rmtree(record["scratch_dir"], ignore_errors=True)
    return sorted(family)


def _signal(procs: list[psutil.Process], send: Callable[[psutil.Process], None]) -> None:
    for proc in procs:
        try:
            send(proc)  # psutil refuses a pid that now belongs to another process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def _family(record: dict) -> list[psutil.Process]:
    """The recorded process (if it is still the one we started), its descendants, and what is left of
    its process group (children whose parent died are re-parented, but keep the group)."""
    found: dict[int, psutil.Process] = {}
    leader = _process(record)
    try:
        if leader is not None:
            found[leader.pid] = leader
            found.update((child.pid, child) for child in leader.children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == record["pgid"] and proc.create_time() >= record["create_time"] - 1:
                found.setdefault(proc.pid, proc)
                for child in proc.children(recursive=True):
                    found.setdefault(child.pid, child)
        except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            continue
    return [proc for proc in found.values() if _running(proc)]


def _process(record: dict) -> psutil.Process | None:
    try:
        proc = psutil.Process(record["pid"])
        if abs(proc.create_time() - record["create_time"]) > 1.0:
            return None  # the pid was reused by another process
        return proc if _running(proc) else None
    except (psutil.NoSuchProcess, KeyError):
        return None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _alive(record: dict) -> bool:
    return _process(record) is not None


@dataclass
class PartStatus:
    part: str
    state: str  # running / not answering / stopped / existing / not reachable
    pid: int | None
    url: str | None
    log: str | None


def status() -> list[PartStatus]:
    stack = read_stack() or {}
    problems = {"ray": _ray_problem, "mlflow": _mlflow_problem, "api": _api_problem}
    rows = []
    for part in PARTS:
        record = stack.get(part)
        if record is None:
            rows.append(PartStatus(part, "stopped", None, None, None))
            continue
        if record.get("external"):
            state = "existing" if problems[part](record) is None else "not reachable"
        elif not _alive(record):
            state = "stopped"
        else:
            state = "running" if problems[part](record) is None else "not answering"
        rows.append(PartStatus(part, state, record.get("pid"), record.get("ui_url") or record.get("url"),
                               record.get("log")))
    return rows


def env_lines() -> list[str]:
    """``export`` lines for the shell: ``eval "$(gmts env)"``."""
    import shlex

    stack = read_stack()
    api = (stack or {}).get("api")
    if not api:
        raise StackError(f"no API recorded in {stack_home() / 'stack.json'}: start it with `gmts up`")
    token = Path(api["token_file"]).read_text().strip()
    return [f"export GMTS_API_URL={shlex.quote(api['url'])}", f"export GMTS_API_TOKEN={shlex.quote(token)}"]


# ---------------------------------------------------------------------------------------- files


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _token_file(path: Path, token: str) -> Path:
    """Generated once and kept: a restarted part keeps the token its clients know."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        path.chmod(0o600)
        return path
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return path


def _write_stack(home: Path, stack: dict) -> None:
    temp = home / "stack.json.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({key: value for key, value in stack.items() if value is not None}, handle, indent=2)
    os.replace(temp, home / "stack.json")


def _say_summary(stack: dict, notes: dict[str, str], say: Callable[[str], None]) -> None:
    api, mlflow, ray = stack["api"], stack["mlflow"], stack["ray"]
    say(f"gmts stack in {stack['home']} (stack.json, logs/)")
    say(f"  API            {api['url']}  {notes.get('api', '')}")
    say(f"                 token in {api['token_file']}")
    say(f"  MLflow UI      {mlflow.get('ui_url') or mlflow['url']}  {notes.get('mlflow', '')}")
    say(f"  Ray dashboard  {ray['url']}  {notes.get('ray', '')}")
    say("Next: gmts sweep submit cpu-smoke && gmts sweep watch   (curl: eval \"$(gmts env)\"; stop: gmts down)")


_LAUNCH = {"ray": _launch_ray, "mlflow": _launch_mlflow, "api": _launch_api}
_WAIT = {"ray": _wait_ray, "mlflow": _wait_mlflow, "api": _wait_api}

