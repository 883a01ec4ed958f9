"""Score one untrusted answer in a throwaway child forked from the verifier process, locked down first.

Why a child per check: a scorer that evaluates the answer text (reasoning-gym's ``eval`` / ``parse_expr``)
runs code the policy wrote. In the long-lived verifier process that code could patch the verifier, and
from then on every answer of every domain would score 1.0. In a child, whatever happens dies with it, and
only a plain float (or a refusal reason) comes back over a pipe as JSON.

What the child does before it touches the answer (the scorer itself was already imported and run once
on the entry's gold answer in the verifier process, so its lazy imports and caches are warm):
- ``PR_SET_PDEATHSIG``: it dies with the verifier process, so the pool's hard deadline (which kills the
  verifier process) also ends it;
- stdout/stderr to /dev/null (a scorer's warnings must not fill the scorer's log);
- the sandbox's own stages (``sandbox_boot.lock_down_scoring_process``): Landlock (no writes anywhere, no
  TCP, no signals or ptrace outside), seccomp (no sockets, no memfd/SysV memory), rlimits (CPU, address
  space, no file growth, no core dumps), no capabilities — each where this machine offers it;
- an audit hook (``sys.addaudithook``) that REFUSES, by raising before the operation happens:
  executing code compiled from a string (the ``exec`` event, which ``eval``/``exec``/``parse_expr`` raise
  before running it — so payload code never runs), starting processes, sockets, ctypes, writing files.
  The refusal is remembered: a scorer that swallows the exception (``except:``) still cannot turn the
  attempt into a silent 0, the check becomes a ``CheckError`` naming the task, and the pool's fail-fast
  (``VerifierBroken``) stops a run whose task cannot be scored safely.
Module code run by an import is allowed (its code object comes from a file that Landlock keeps read-only);
answer text cannot trigger an import without first executing, which is refused.

Cost: one ``fork`` of the verifier process (and its exit) per check.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import math
import os
import select
import signal
import sys
import time
from collections.abc import Callable

from workers.reward import sandbox_boot
from workers.reward.results import CheckError, CheckTimeout

logger = logging.getLogger(__name__)

_REPLY_LIMIT_BYTES = 4096
_CHILD_ERROR_EXIT = 3
_WALL_CLOCK_GRACE_S = 5.0
# Address space the child may add to what the verifier process already maps: sympy's simplify on a
# legitimate answer stays far below; a runaway computation hits MemoryError instead of the host's OOM killer.
_EXTRA_ADDRESS_SPACE_BYTES = 2 << 30

# Audit events refused outright (prefix match on the event name); "exec" and "open" are judged by their arguments.
_REFUSED_EVENT_PREFIXES = (
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.link",
    "os.symlink", "os.putenv", "os.unsetenv", "os.startfile", "subprocess.", "pty.spawn", "socket.", "ctypes.",
    "shutil.", "webbrowser.", "urllib.", "http.client.", "ftplib.", "smtplib.", "imaplib.", "poplib.",
    "telnetlib.", "nntplib.", "sys.settrace", "sys.setprofile", "winreg.", "resource.setrlimit",
    "resource.prlimit", "signal.pthread_kill",
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class _Refused(BaseException):
    """Raised by the audit hook; a BaseException so that ``except Exception`` in a scorer does not catch it
    (a bare ``except:`` does, which is why the refusal is also recorded)."""


def score_in_child(score: Callable[[], float], *, task: str, cpu_seconds: int) -> float:
    """``score()`` run in a locked-down forked child; its float, or ``CheckError`` naming ``task``."""
    landlock, seccomp = available_layers()
    memory_bytes = _address_space_bytes() + _EXTRA_ADDRESS_SPACE_BYTES
    read_fd, write_fd = os.pipe()
    # The child's copy of every existing object sits in the permanent generation, so a collection there does not
    # walk (and copy-on-write) the verifier's whole heap; it also disables the collector (it lives one check).
    # The parent unfreezes at once, so that its own garbage stays collectable.
    gc.freeze()
    pid = os.fork()
    if pid != 0:
        gc.unfreeze()
    if pid == 0:  # the child: never return into the verifier's code
        exit_code = _CHILD_ERROR_EXIT
        try:
            gc.disable()
            os.close(read_fd)
            exit_code = _child(score, write_fd, landlock=landlock, seccomp=seccomp, cpu_seconds=cpu_seconds,
                               memory_bytes=memory_bytes)
        finally:
            os._exit(exit_code)
    os.close(write_fd)
    # A wall clock of our own too: a caller outside the verifier pool (benchmarks call verify_completion
    # directly) has no hard deadline, and a child forked from a multi-threaded process can block on a lock
    # another thread held at the fork, using no CPU.
    wall_clock_s = 2 * cpu_seconds + _WALL_CLOCK_GRACE_S
    try:
        reply = _read_all(read_fd, time.monotonic() + wall_clock_s)
    finally:
        os.close(read_fd)
        if reply is None:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if reply is None:
        raise CheckTimeout(f"timeout: reasoning-gym task {task!r}'s scorer ran past {wall_clock_s:g} s and was killed")
    return _verdict(reply, os.waitstatus_to_exitcode(status), task=task, cpu_seconds=cpu_seconds)


@functools.cache
def available_layers() -> tuple[bool, bool]:
    """(Landlock, seccomp): the kernel layers this machine offers, found once per process."""
    landlock = sandbox_boot.landlock_abi() >= 1
    seccomp = sandbox_boot.seccomp_arch() is not None
    if not landlock or not seccomp:
        logger.warning("scoring jail: running reasoning-gym scorers without %s (not available here); the audit "
                       "hook still refuses code execution", " and ".join(
                           name for name, used in (("Landlock", landlock), ("seccomp", seccomp)) if not used))
    return landlock, seccomp


def _child(score: Callable[[], float], write_fd: int, *, landlock: bool, seccomp: bool, cpu_seconds: int,
           memory_bytes: int) -> int:
    parent = os.getppid()
    sandbox_boot.die_with_parent()
    if os.getppid() != parent:  # the parent died before PR_SET_PDEATHSIG took effect
        return _CHILD_ERROR_EXIT
    _silence_output()
    refusals: list[str] = []
    try:
        sandbox_boot.lock_down_scoring_process(landlock=landlock, seccomp=seccomp, cpu_seconds=cpu_seconds,
                                               memory_bytes=memory_bytes)
        sys.addaudithook(functools.partial(_refuse_side_effects, refusals))
        value = score()
        reply = ({"refused": refusals[0]} if refusals else {"score": float(value)})
    except BaseException as error:  # noqa: BLE001 - everything becomes a reply; nothing may escape the child
        reply = {"refused": refusals[0]} if refusals else {"error": f"{type(error).__name__}: {error}"[:500]}
    os.write(write_fd, json.dumps(reply).encode()[:_REPLY_LIMIT_BYTES])
    return 0


def _refuse_side_effects(refusals: list[str], event: str, args: tuple) -> None:
    reason = None
    if event == "exec":
        filename = getattr(args[0], "co_filename", "") if args else ""
        # Module code (an import) comes from a .py file; eval/exec of text is compiled as "<string>" etc.
        if not (filename.endswith(".py") and os.path.isabs(filename)):
            reason = "execute the answer text"
    elif event == "open":
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS):
            reason = f"open {args[0]!r} for writing"
    elif event.startswith(_REFUSED_EVENT_PREFIXES):
        reason = f"perform {event!r}"
    if reason is not None:
        refusals.append(reason)
        raise _Refused(reason)


def _verdict(reply: bytes, exit_code: int, *, task: str, cpu_seconds: int) -> float:
    try:
        message = json.loads(reply.decode()) if reply else None
    except ValueError:
        message = None
    if isinstance(message, dict) and type(message.get("score")) in (float, int):
        value = float(message["score"])
        if math.isnan(value):
            raise CheckError(f"reasoning_gym task {task!r} returned NaN")
        return value
    if isinstance(message, dict) and isinstance(message.get("refused"), str):
        raise CheckError(f"reasoning-gym task {task!r}'s scorer tried to {message['refused']}; refused, "
                         "the answer was not scored")
    if isinstance(message, dict) and isinstance(message.get("error"), str):
        raise CheckError(f"reasoning-gym task {task!r}'s scorer failed: {message['error']}")
    if exit_code in (-signal.SIGXCPU, -signal.SIGKILL):
        raise CheckTimeout(f"timeout: reasoning-gym task {task!r}'s scorer used its {cpu_seconds} s of CPU time")
    raise CheckError(f"reasoning-gym task {task!r}'s scoring process ended with exit code {exit_code} "
                     "and no verdict")


def _read_all(fd: int, deadline: float) -> bytes | None:
    """Everything the child writes until it closes the pipe (it exits), or None at ``deadline``."""
    chunks = []
    size = 0
    while size <= _REPLY_LIMIT_BYTES:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _silence_output() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


def _address_space_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0
