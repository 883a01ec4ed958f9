"""Run an untrusted Python program in a throwaway, locked-down process and report how it ended.

The child starts as ``sandbox_boot.py`` (which applies the isolation layers, then runs the
program); this module chooses the layers, runs the child in its own session and throwaway temp
directory, enforces the wall-clock limit by killing the whole process group (and with it, in the
namespace mode, the PID namespace; without namespaces the boot process, a subreaper, kills every
descendant first), and captures the tail of the output. ``sandboxed_python`` yields while the
program runs, so that a caller can talk to it over descriptors it passes in (the code verifier's
call channel); ``run_python_in_sandbox`` just runs a program to its end.

Which layers work here is found once per process and configuration by running a tiny program
under them; a layer that cannot work here is dropped with a warning, never silently.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from workers.reward import sandbox_boot
from workers.reward.config import SandboxConfig
from workers.reward.results import CheckError

logger = logging.getLogger(__name__)

_BOOT_SCRIPT = Path(sandbox_boot.__file__).resolve()
_PROBE_TIMEOUT_S = 10.0
# The probe imports a module the boot process has not loaded: the standard library must be readable.
_PROBE_PROGRAM = "import fractions\nprint('sandbox-ok', fractions.Fraction(1, 2))\n"
_OUTPUT_TAIL_BYTES = 4096
_EXPOSED_PATHS = sandbox_boot.default_exposed_paths()
_HIDDEN_PATHS = sandbox_boot.default_hidden_paths(_EXPOSED_PATHS)
_GROUP_EXIT_TIMEOUT_S = 5.0
# Without namespaces the supervisor inside enforces the wall clock (and kills every descendant); the
# parent's own kill comes this much later, so that it never orphans them first.
_SUPERVISOR_GRACE_S = 2.0
# How long a program that was asked to stop may take to end by itself: a process tree that exits is
# reaped by its own parents, while one that is killed leaves its zombies to the host's init.
STOP_GRACE_S = 0.5


class SandboxSetupError(CheckError):
    """A requested isolation layer failed in the child; the program did not run."""


@dataclass(frozen=True)
class IsolationPlan:
    namespaces: bool
    landlock: bool
    seccomp: bool

    @property
    def layers(self) -> tuple[str, ...]:
        wanted = {"namespaces": self.namespaces, "landlock": self.landlock, "seccomp": self.seccomp}
        return tuple(layer for layer, used in wanted.items() if used) + ("rlimits",)


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int  # negative: killed by that signal (subprocess's convention)
    timed_out: bool
    output_tail: str
    layers: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class RunningSandbox:
    """A sandboxed program while it runs (see ``sandboxed_python``); ``result`` is set once it has ended."""

    def __init__(self, deadline: float, layers: tuple[str, ...]):
        self.deadline = deadline  # time.monotonic() past which the sandbox is killed
        self.layers = layers
        self.result: SandboxResult | None = None
        self.stop_requested = False

    def stop_now(self) -> None:
        """On leaving the block, wait only ``STOP_GRACE_S`` for the program to end, then kill it."""
        self.stop_requested = True


def run_python_in_sandbox(source: str, config: SandboxConfig) -> SandboxResult:
    """Run ``source`` as a Python program under ``config``'s limits; never raises for what the program does."""
    with sandboxed_python(source, config) as running:
        pass
    assert running.result is not None
    return running.result


@contextlib.contextmanager
def sandboxed_python(source: str, config: SandboxConfig, *, pass_fds: Sequence[int] = ()) -> Iterator[RunningSandbox]:
    """Start ``source`` in the sandbox and yield while it runs; on leaving, wait for it until its wall
    clock, kill whatever is left and set ``result``. ``pass_fds`` are inherited by the program only
    (e.g. the ends of a call channel). Raises ``SandboxSetupError`` if a layer could not be set up."""
    plan = isolation_plan_for(config)
    # ignore_cleanup_errors: the program may leave a directory it made unreadable; that must not fail the check.
    with tempfile.TemporaryDirectory(prefix="gmts-sandbox-", ignore_cleanup_errors=True) as root:
        program = _write_private(Path(root, "program.py"), source)
        with _started_boot(config, plan, str(program), Path(root), pass_fds) as (running, finish):
            yield running
        outcome = finish()
    if outcome.setup_failed:
        raise SandboxSetupError(outcome.output_tail.strip().splitlines()[-1])
    running.result = SandboxResult(exit_code=outcome.exit_code, timed_out=outcome.timed_out,
                                   output_tail=outcome.output_tail, layers=plan.layers)


def isolation_plan_for(config: SandboxConfig) -> IsolationPlan:
    """The isolation layers ``config`` asks for that work on this machine (found once per process)."""
    return isolation_plan(use_namespaces=config.use_namespaces, use_landlock=config.use_landlock,
                          use_seccomp=config.use_seccomp, isolate_network=config.isolate_network)


@functools.cache
def isolation_plan(*, use_namespaces: bool, use_landlock: bool, use_seccomp: bool,
                   isolate_network: bool) -> IsolationPlan:
    landlock = use_landlock and sandbox_boot.landlock_abi() >= 1
    if use_landlock and not landlock:
        logger.warning("sandbox: Landlock is not available on this kernel; running without it")
    seccomp = use_seccomp and sandbox_boot.seccomp_arch() is not None
    if use_seccomp and not seccomp:
        logger.warning("sandbox: no seccomp filter for this architecture; running without it")
    plan = IsolationPlan(namespaces=use_namespaces, landlock=landlock, seccomp=seccomp)
    failure = _probe_failure(plan, isolate_network)
    if failure is not None and plan.namespaces:
        # The usual cause: user namespaces are denied (containers, AppArmor). Try without them.
        logger.warning("sandbox: cannot use namespaces here (%s); running without them", failure)
        plan = IsolationPlan(namespaces=False, landlock=landlock, seccomp=seccomp)
        failure = _probe_failure(plan, isolate_network)
    if not plan.namespaces:
        logger.warning(
            "sandbox: running untrusted code WITHOUT namespaces: the program sees the host's whole filesystem "
            "and may read every file its user (%s) can read (world-readable files, datasets in the virtualenv "
            "included), its working directory is not size-limited, and it shares RLIMIT_NPROC with other "
            "sandboxes of that user%s", "nobody" if os.geteuid() == 0 else f"uid {os.geteuid()}",
            "" if landlock and sandbox_boot.landlock_abi() >= 6 or os.geteuid() == 0 else
            "; it can signal its supervisor (same uid, Landlock < ABI 6), which would let its daemons outlive it")
    if failure is not None:
        logger.error("sandbox: a test program fails under layers %s (%s); code checks will fail", plan.layers,
                     failure)
    return plan


def _probe_failure(plan: IsolationPlan, isolate_network: bool) -> str | None:
    """None if a tiny program runs under ``plan``, else what went wrong."""
    config = SandboxConfig(wall_timeout_s=_PROBE_TIMEOUT_S, isolate_network=isolate_network)
    with tempfile.TemporaryDirectory(prefix="gmts-sandbox-probe-") as root:
        program = _write_private(Path(root, "program.py"), _PROBE_PROGRAM)
        with _started_boot(config, plan, str(program), Path(root), ()) as (_, finish):
            pass
        outcome = finish()
    if outcome.timed_out:
        return f"the probe did not finish within {_PROBE_TIMEOUT_S:g} s"
    if outcome.exit_code != 0 or "sandbox-ok 1/2" not in outcome.output_tail:
        return f"exit code {outcome.exit_code}: {outcome.output_tail.strip()[-500:]}"
    return None


def _boot_spec(config: SandboxConfig, plan: IsolationPlan, program: str, root: Path, workdir: Path,
               status_fd: int, keep_fds: Sequence[int]) -> sandbox_boot.BootSpec:
    megabyte = 1 << 20
    return sandbox_boot.BootSpec(
        program=program,
        workdir=str(workdir),
        root_dir=str(root),
        namespaces=plan.namespaces,
        landlock=plan.landlock,
        seccomp=plan.seccomp,
        isolate_network=config.isolate_network,
        cpu_seconds=config.cpu_seconds,
        memory_bytes=config.memory_mb * megabyte,
        file_size_bytes=config.file_size_mb * megabyte,
        max_processes=config.max_processes,
        workdir_bytes=config.workdir_mb * megabyte,
        wall_timeout_s=config.wall_timeout_s,
        status_fd=status_fd,
        keep_fds=list(keep_fds),
        exposed_paths=_EXPOSED_PATHS,
        hidden_paths=_HIDDEN_PATHS,
    )


class _BootOutcome(NamedTuple):
    exit_code: int
    timed_out: bool
    output_tail: str
    setup_failed: bool


@contextlib.contextmanager
def _started_boot(config: SandboxConfig, plan: IsolationPlan, program: str, root: Path,
                  pass_fds: Sequence[int]) -> Iterator[tuple[RunningSandbox, Callable[[], _BootOutcome]]]:
    """Start the boot script; yield (running, finish). Leaving the block waits for the program until
    its wall clock and kills whatever of it is left; ``finish()`` then reads how it ended.

    The exit code is the program's, from the wait status the boot process reports on a pipe (the
    boot's own exit status is that of its stages, which lose signals). No report means the program
    never ran (set-up failed) or the boot process was killed.
    """
    workdir = root / "work"
    workdir.mkdir(mode=0o700)
    output_path = _write_private(root / "output.log", "")
    status_read, status_write = os.pipe()
    wall_clock_s = config.wall_timeout_s + (0.0 if plan.namespaces else _SUPERVISOR_GRACE_S)
    outcome: list[_BootOutcome] = []
    try:
        spec = _boot_spec(config, plan, program, root, workdir, status_write, pass_fds)
        with open(output_path, "wb") as output:
            process = subprocess.Popen(
                [sys.executable, "-I", str(_BOOT_SCRIPT), spec.to_json()],
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, cwd=workdir,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, pass_fds=(status_write, *pass_fds),
                start_new_session=True,  # its own process group, so that one killpg reaches every descendant
            )
            started = time.monotonic()
            os.close(status_write)
            status_write = -1
            running = RunningSandbox(started + config.wall_timeout_s, plan.layers)
            try:
                yield running, lambda: outcome[0]
            finally:
                try:
                    wait_s = started + wall_clock_s - time.monotonic()
                    if running.stop_requested:
                        wait_s = min(wait_s, STOP_GRACE_S)
                    timed_out = not _wait_without_reaping(process.pid, wait_s) and not running.stop_requested
                finally:
                    # The leader is not reaped yet, so its pid (the group id) cannot have been reused.
                    _signal_group(process.pid)  # also ends children the program left behind
                    boot_exit_code = process.wait()
                    _kill_until_group_is_empty(process.pid)
                reported = _read_reported_status(status_read)
                output_tail = _read_tail(output_path)
                if reported == sandbox_boot.TIMED_OUT_REPORT:
                    outcome.append(_BootOutcome(-signal.SIGKILL, True, output_tail, setup_failed=False))
                elif reported is not None:
                    outcome.append(_BootOutcome(os.waitstatus_to_exitcode(int(reported)), timed_out, output_tail,
                                                setup_failed=False))
                else:
                    setup_failed = (not timed_out and boot_exit_code == sandbox_boot.SETUP_FAILED_EXIT
                                    and sandbox_boot.SETUP_FAILED_MARKER in output_tail)
                    outcome.append(_BootOutcome(boot_exit_code, timed_out, output_tail, setup_failed))
    finally:
        os.close(status_read)
        if status_write >= 0:
            os.close(status_write)


def _write_private(path: Path, text: str) -> Path:
    """Only the scorer's user may read it (without namespaces, the sandbox's user can reach the directory)."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(text)
    return path


def _read_reported_status(status_read: int) -> str | None:
    """The wait status (digits) or ``TIMED_OUT_REPORT`` the boot process wrote, if any."""
    os.set_blocking(status_read, False)  # a writer that outlived the group kill must not hang us
    try:
        text = os.read(status_read, 64).decode(errors="replace").strip()
    except BlockingIOError:
        return None
    return text if text.isdigit() or text == sandbox_boot.TIMED_OUT_REPORT else None


def _wait_without_reaping(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` has exited (left a zombie), False if ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


def _signal_group(group_id: int) -> bool:
    """SIGKILL every member of the group; False if it has none left."""
    try:
        os.killpg(group_id, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _kill_until_group_is_empty(group_id: int) -> None:
    """Wait (killing again) until the group is empty; a PID namespace full of fork-bomb processes
    is torn down in the background after its init dies. While any member lives, the group id cannot
    be handed to a new process, and the first "no such group" ends the loop."""
    deadline = time.monotonic() + _GROUP_EXIT_TIMEOUT_S
    while _signal_group(group_id):
        if time.monotonic() >= deadline:
            logger.warning("sandbox: process group %d still has members %g s after SIGKILL", group_id,
                           _GROUP_EXIT_TIMEOUT_S)
            return
        time.sleep(0.01)


def _read_tail(path: Path) -> str:
    with open(path, "rb") as output:
        output.seek(max(0, path.stat().st_size - _OUTPUT_TAIL_BYTES))
        return output.read().decode("utf-8", errors="replace")
