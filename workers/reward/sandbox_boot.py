"""The first code that runs in a sandbox process: it locks the process down, then runs the program.

Run as a script (``python -I sandbox_boot.py SPEC_JSON``) by ``workers.reward.sandbox``; it uses the
standard library only, because under ``-I`` the project is not importable. The parent imports it
too, for ``BootSpec``, ``landlock_abi`` and ``seccomp_arch``. Every step fails closed: if a requested layer cannot be
set up, the program never runs (exit code ``SETUP_FAILED_EXIT`` and a line starting with
``SETUP_FAILED_MARKER`` on stderr).

The program is read into memory first and never executed from a file: the last process forks and
runs it in the interpreter that is already loaded, so no interpreter or script has to be readable
by the unprivileged user the program runs as.

With namespaces (four processes, each waiting for the next):
1. *outer* (the scorer's user): drops supplementary groups, forks *setup*, and once *setup* has made
   its user namespace writes that namespace's uid/gid maps: namespace root is host uid/gid
   ``NOBODY`` (65534) when the scorer is root, else the scorer's own uid (an unprivileged process
   cannot map another). The program then has no right on host files that ``nobody`` lacks.
2. *setup*: ``unshare`` user, mount, PID, IPC (and network) namespaces; while it still holds host
   uid 0 (owner of a 0700 ``/root`` that may hold the interpreter) it builds a minimal root: a
   skeleton directory with bind mounts of ``/usr`` (+ the ``/bin``-style links) and the base
   interpreter's prefix only; ``pivot_root`` into it, so the repository, virtualenv, datasets, home
   directories, ``/tmp`` and every socket file of the host are not there at all; the Python package
   directories inside what is exposed (``site-packages``, ``dist-packages``) are covered by empty mounts. Then it becomes
   namespace root (host ``nobody``) and forks *init*, PID 1 of the new PID namespace.
3. *init*: mounts ``/proc``, a size-limited tmpfs at ``/work``; remounts every other mount
   read-only (``mount_setattr``, recursive); the OOM score; no-new-privileges; Landlock; seccomp;
   resource limits; drops every capability (bounding set too). It stays PID 1 (the kernel ignores
   default-action signals sent to a PID 1, so the program as PID 1 would shrug off SIGXCPU) and
   reaps orphans; when the program ends it reports its raw wait status on ``status_fd``; when *init*
   dies the kernel kills everything in the namespace.
4. *program*: runs the source as ``__main__``.
The kernel exempts only *real* uid 0 (host) from RLIMIT_NPROC; the program's real uid is host
``nobody`` (or the scorer's) and RLIMIT_NPROC counts per user namespace, so a fork bomb is capped at
``max_processes`` per sandbox.

Without namespaces (two processes): the boot process becomes a *supervisor*
(``PR_SET_CHILD_SUBREAPER``: every orphan of the program is re-parented to it, ``setsid`` or not);
it forks the program, which locks itself down (Landlock, seccomp, limits) and, if the scorer is
root, becomes ``nobody`` for good, after importing the standard modules the program names (those of
a program held in one of its string literals included: the code verifier's candidate). The
supervisor enforces the wall clock itself and, once the program has ended, kills every descendant
until none is left. It runs no untrusted code.
"""

from __future__ import annotations

import ast
import atexit
import glob
import builtins
import ctypes
import json
import os
import resource
import signal
import sys
import time
import traceback
import types
from dataclasses import asdict, dataclass

SETUP_FAILED_EXIT = 120
SETUP_FAILED_MARKER = "sandbox setup failed:"
NOBODY = 65534  # the host uid/gid the sandbox runs as when the scorer is root
INSIDE_WORKDIR = "/work"  # the working directory as the program sees it under namespaces
TIMED_OUT_REPORT = "timeout"  # the supervisor's report on status_fd when it killed the program at the wall clock

# Syscall numbers shared by x86-64 and arm64 (the generic table numbers these recent syscalls alike).
_SYS_MOUNT_SETATTR = 442
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x00020000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
# Landlock filesystem rights that change something (reads stay allowed everywhere).
_LL_WRITE_FILE = 1 << 1
_LL_WRITE_RIGHTS_ABI1 = (
    _LL_WRITE_FILE
    | (1 << 4)  # REMOVE_DIR
    | (1 << 5)  # REMOVE_FILE
    | (1 << 6)  # MAKE_CHAR
    | (1 << 7)  # MAKE_DIR
    | (1 << 8)  # MAKE_REG
    | (1 << 9)  # MAKE_SOCK
    | (1 << 10)  # MAKE_FIFO
    | (1 << 11)  # MAKE_BLOCK
    | (1 << 12)  # MAKE_SYM
)
_LL_REFER = 1 << 13  # ABI 2: renames/links across directories
_LL_TRUNCATE = 1 << 14  # ABI 3
_LL_NET_BIND_TCP, _LL_NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_LL_SCOPE_ABSTRACT_UNIX_SOCKET, _LL_SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
# Per architecture: (AUDIT_ARCH value, socket syscall number, lowest syscall number of a foreign ABI).
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, 41, 0x40000000),  # x32 syscalls carry bit 30
    "aarch64": (0xC00000B7, 198, None),
}
# Syscalls that fail with EACCES, and why:
# - io_uring_setup: io_uring could open sockets past the socket() rule;
# - memfd_create, memfd_secret, shmget, msgget: memory held in anonymous files, SysV segments or
#   message queues is not address space, so RLIMIT_AS would not bound it (a memfd bomb held 2.5 GB);
# - bpf, perf_event_open, add_key, request_key, keyctl: kernel objects no test program needs, whose
#   memory is not charged to the process either.
_DENIED_SYSCALLS = {
    "x86_64": {"io_uring_setup": 425, "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68,
               "bpf": 321, "perf_event_open": 298, "add_key": 248, "request_key": 249, "keyctl": 250},
    "aarch64": {"io_uring_setup": 425, "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "msgget": 186,
                "bpf": 280, "perf_event_open": 241, "add_key": 217, "request_key": 218, "keyctl": 219},
}
_AF_INET, _AF_INET6 = 2, 10
_EACCES = 13
# Open files per process: bounds the kernel memory of pipe and socket buffers (also not address space).
_MAX_OPEN_FILES = 256
# Device nodes the program may open (bind-mounted from the host's /dev into the minimal root).
_DEVICES = ("null", "zero", "random", "urandom")


@dataclass(frozen=True)
class BootSpec:
    """What the parent asks for."""

    program: str  # path of the source file (read by the boot process before it locks down)
    workdir: str  # host path of the working directory
    root_dir: str  # host directory (root-owned, private) where the minimal root's skeleton is built
    namespaces: bool
    landlock: bool
    seccomp: bool
    isolate_network: bool
    cpu_seconds: int
    memory_bytes: int
    file_size_bytes: int
    max_processes: int
    workdir_bytes: int
    wall_timeout_s: float  # enforced by the supervisor without namespaces (the parent enforces it too)
    status_fd: int  # write end of the pipe for the program's wait status
    keep_fds: list[int]  # extra descriptors the program inherits (e.g. a call channel)
    exposed_paths: list[str]  # host directories visible (read-only) in the minimal root
    hidden_paths: list[str]  # directories inside those that are covered by an empty tmpfs

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BootSpec:
        return cls(**json.loads(text))


class SetupFailed(RuntimeError):
    pass


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def _prctl(option: int, *args: int) -> None:
    # Arguments as unsigned long, as the kernel reads them (ctypes would pass Python ints as C int).
    values = [ctypes.c_ulong(arg) for arg in (*args, 0, 0, 0, 0)[:4]]
    if _libc.prctl(ctypes.c_int(option), *values) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: text.encode() if text is not None else None  # noqa: E731
    if _libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)) != 0:
        errno = ctypes.get_errno()
        raise SetupFailed(f"mount {source!r} on {target!r}: {os.strerror(errno)}")


def landlock_abi() -> int:
    """Landlock ABI version of the running kernel; 0 when Landlock is missing or disabled."""
    try:
        return _syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    except OSError:
        return 0


def seccomp_arch() -> str | None:
    """The machine name if the seccomp filter knows its syscall numbers, else None."""
    machine = os.uname().machine
    return machine if machine in _SECCOMP_ARCHES else None


def default_hidden_paths(exposed_paths: list[str]) -> list[str]:
    """Python package directories inside the exposed paths: installed packages include datasets
    (HumanEval's own tests and solutions ship in one), and the program needs only the standard library."""
    patterns = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages",
                "local/lib/python3*/site-packages", "local/lib/python3*/dist-packages")
    hidden = []
    for path in exposed_paths:
        for pattern in patterns:
            hidden.extend(sorted(glob.glob(os.path.join(path, pattern))))
    return [path for path in dict.fromkeys(hidden) if os.path.isdir(path)]


def default_exposed_paths() -> list[str]:
    """Host directories the minimal root shows: the system's programs and libraries, and the base
    interpreter's prefix (its standard library; not the virtualenv, whose packages include datasets)."""
    paths = ["/usr"]
    for prefix in (sys.base_prefix, sys.base_exec_prefix):
        real = os.path.realpath(prefix)
        if not any(real == path or real.startswith(path + "/") for path in paths):
            paths.append(real)
    return paths


# --- namespaces: outer and setup stages ------------------------------------------------------------

def _write_id_maps(pid: int) -> None:
    """Namespace root = host nobody when we are root, else our own uid (the only one we may map)."""
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    gid = NOBODY if os.geteuid() == 0 else os.getegid()
    with open(f"/proc/{pid}/setgroups", "w") as setgroups:
        setgroups.write("deny")  # nor may the namespace's root pick up groups with setgroups()
    with open(f"/proc/{pid}/uid_map", "w") as uid_map:
        uid_map.write(f"0 {uid} 1\n")
    with open(f"/proc/{pid}/gid_map", "w") as gid_map:
        gid_map.write(f"0 {gid} 1\n")


def _build_minimal_root(spec: BootSpec) -> str:
    """Skeleton of the new root, made by the outer stage (still host root) inside its private dir."""
    new_root = os.path.join(spec.root_dir, "root")
    os.mkdir(new_root, 0o755)
    for name in ("proc", "dev", "old-root", INSIDE_WORKDIR.strip("/")):
        os.mkdir(os.path.join(new_root, name), 0o755)
    for device in _DEVICES:
        open(os.path.join(new_root, "dev", device), "w").close()
    for path in spec.exposed_paths:
        os.makedirs(new_root + path, 0o755, exist_ok=True)
    # Top-level links such as /bin -> usr/bin (merged /usr), so that /bin/sh resolves.
    for entry in os.listdir("/"):
        link = os.path.join("/", entry)
        if os.path.islink(link) and not os.path.lexists(os.path.join(new_root, entry)):
            target = os.readlink(link)
            if target.lstrip("/").split("/")[0] in {p.strip("/").split("/")[0] for p in spec.exposed_paths}:
                os.symlink(target, os.path.join(new_root, entry))
    return new_root


def _bind_exposed_paths(new_root: str, exposed_paths: list[str]) -> None:
    _mount(new_root, new_root, None, _MS_BIND)  # pivot_root needs the new root to be a mount point
    for path in exposed_paths:
        _mount(path, new_root + path, None, _MS_BIND | _MS_REC)
    for device in _DEVICES:
        _mount(f"/dev/{device}", os.path.join(new_root, "dev", device), None, _MS_BIND)


def _pivot_root(new_root: str) -> None:
    """Make ``new_root`` the root and detach the old one: nothing else of the host stays reachable."""
    os.chdir(new_root)
    try:
        _syscall(_SYS_PIVOT_ROOT[os.uname().machine], b".", b"old-root")
    except OSError as error:
        raise SetupFailed(f"pivot_root: {error}") from error
    os.chdir("/")
    if _libc.umount2(b"/old-root", ctypes.c_int(_MNT_DETACH)) != 0:
        raise SetupFailed(f"detaching the old root: {os.strerror(ctypes.get_errno())}")


def _become_namespace_root() -> None:
    # Until now our credentials were the host's (uid 0 when the scorer is root); namespace uid 0 is
    # host nobody. Groups first: setresuid gives up the right to change them.
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)


def _wait_and_exit_like(pid: int) -> int:
    """Wait for ``pid``; exit with its status (a death by signal becomes 128 + signal)."""
    while True:
        waited, status = os.waitpid(pid, 0)
        if waited == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def _run_in_namespaces(spec: BootSpec, source: str) -> int:
    if os.geteuid() == 0:
        os.setgroups([])  # supplementary groups would keep host rights (group root) inside
    new_root = _build_minimal_root(spec)
    to_outer_read, to_outer_write = os.pipe()
    to_setup_read, to_setup_write = os.pipe()
    setup_pid = os.fork()
    if setup_pid == 0:
        os.close(to_outer_read)
        os.close(to_setup_write)
        os._exit(_guarded(lambda: _setup_stage(spec, source, new_root, to_outer_write, to_setup_read)))
    os.close(to_outer_write)
    os.close(to_setup_read)
    _close_fds([spec.status_fd, *spec.keep_fds])  # only the program's side may hold them open
    if os.read(to_outer_read, 1) == b"u":
        try:
            _write_id_maps(setup_pid)
            os.write(to_setup_write, b"m")
        except OSError as error:
            print(f"{SETUP_FAILED_MARKER} writing the user namespace's id maps: {error}", file=sys.stderr,
                  flush=True)
    os.close(to_outer_read)
    os.close(to_setup_write)
    return _wait_and_exit_like(setup_pid)


def _setup_stage(spec: BootSpec, source: str, new_root: str, to_outer: int, from_outer: int) -> int:
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC
    if spec.isolate_network:
        flags |= _CLONE_NEWNET
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        raise SetupFailed(f"unshare: {os.strerror(ctypes.get_errno())}")
    os.write(to_outer, b"u")
    if os.read(from_outer, 1) != b"m":
        raise SetupFailed("the outer stage did not map the user namespace")
    os.close(to_outer)
    os.close(from_outer)
    init_pid = os.fork()  # PID 1 of the new PID namespace
    if init_pid == 0:
        os._exit(_guarded(lambda: _init_stage(spec, source, new_root)))
    _close_fds([spec.status_fd, *spec.keep_fds])
    return _wait_and_exit_like(init_pid)


def _init_stage(spec: BootSpec, source: str, new_root: str) -> int:
    # While our credentials are still the host's, so that the exposed paths can be looked up; and
    # /proc before the pivot: the kernel mounts a new proc only while a full one is visible.
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing we mount propagates back to the host
    _bind_exposed_paths(new_root, spec.exposed_paths)
    _mount("proc", os.path.join(new_root, "proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _pivot_root(new_root)
    # RLIMIT_NPROC counts per (user namespace, uid). When the scorer is not root, setup already ran
    # as the uid we are about to take (it shows as 0 here) and counts; else only we will.
    tasks_already_charged = 2 if os.getuid() == 0 else 1
    _become_namespace_root()
    for path in spec.hidden_paths:
        _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4096,mode=0555")
    _make_filesystem_read_only()
    # The tmpfs comes after the read-only remount, so it stays writable; and after becoming namespace
    # root, so that its root directory belongs to the program.
    _mount("tmpfs", INSIDE_WORKDIR, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={spec.workdir_bytes},mode=0700")
    _raise_oom_score()
    _lock_down(spec, INSIDE_WORKDIR, tasks_already_charged)
    _drop_capabilities()
    program_pid = _fork_program(spec, source, INSIDE_WORKDIR, exposed=True)
    while True:  # PID 1 reaps every orphan of the namespace until the program itself ends
        pid, status = os.waitpid(-1, 0)
        if pid == program_pid:
            break
    os.write(spec.status_fd, f"{status}\n".encode())
    return 0


# --- without namespaces: the supervisor -------------------------------------------------------------

def _run_supervised(spec: BootSpec, source: str) -> int:
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    running_as_root = os.geteuid() == 0
    if running_as_root:
        # nobody must reach its working directory: through the private root dir, which it may
        # traverse but not list (its other files are 0600).
        os.chmod(spec.root_dir, 0o711)
        os.chown(spec.workdir, NOBODY, NOBODY)
    ready_read, ready_write = os.pipe()
    program_pid = os.fork()
    if program_pid == 0:
        os.close(ready_read)
        os._exit(_guarded(lambda: _unprivileged_program(spec, source, running_as_root, ready_write)))
    os.close(ready_write)
    _close_fds(spec.keep_fds)
    deadline = time.monotonic() + spec.wall_timeout_s
    status = None
    pause = 0.002
    while status is None and time.monotonic() < deadline:
        pid, wait_status = os.waitpid(program_pid, os.WNOHANG)
        if pid == program_pid:
            status = wait_status
        else:
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
    if status is None:
        os.kill(program_pid, signal.SIGKILL)
    _kill_every_descendant()
    locked_down = os.read(ready_read, 1) == b"r"  # the program's process wrote it just before running it
    os.close(ready_read)
    if locked_down:
        report = f"{status}" if status is not None else TIMED_OUT_REPORT
        os.write(spec.status_fd, f"{report}\n".encode())
    return SETUP_FAILED_EXIT if not locked_down else 0


def _kill_every_descendant() -> None:
    """SIGKILL our children until there are none: as subreaper we inherit every orphan, so a
    double-forked ``setsid`` daemon comes back to us when its parent dies, and dies too."""
    while True:
        children = _children_of(os.getpid())
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return  # no child left, reaped or not
        if not children:
            time.sleep(0.005)


def _children_of(pid: int) -> list[int]:
    if os.path.exists(f"/proc/{pid}/task/{pid}/children"):  # CONFIG_PROC_CHILDREN
        children = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as listing:
                    children.extend(int(child) for child in listing.read().split())
            except OSError:
                continue
        return children
    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # "pid (comm) state ppid …": comm may hold spaces and parentheses, so split after the last ")"
                if entry.isdigit() and int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return children


def _unprivileged_program(spec: BootSpec, source: str, running_as_root: bool, ready_fd: int) -> int:
    _close_fds([spec.status_fd])
    _raise_oom_score()
    if running_as_root:
        _preimport_standard_modules(source)  # the standard library may be unreadable by nobody
        os.setgroups([])
        tasks_already_charged = _tasks_of_real_uid(NOBODY)
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    else:
        tasks_already_charged = _tasks_of_real_uid(os.getuid())
    # This process is the program, the first of its max_processes.
    _lock_down(spec, spec.workdir, tasks_already_charged)
    os.write(ready_fd, b"r")
    os.close(ready_fd)
    return _exec_program(spec, source, spec.workdir, exposed=False)


# Standard modules never imported as root, although a program may name them: importing them does
# something (opens a browser, prints, starts IDLE or the regression test suite, writes lib2to3's grammar
# cache into the standard library, installs pip) — as root, before the program is locked down.
_NOT_PREIMPORTED = frozenset({"antigravity", "this", "__hello__", "__phello__", "idlelib", "turtledemo",
                              "test", "lib2to3", "ensurepip", "venv"})
# Submodule names that are scripts or test suites: ``import unittest.__main__`` runs unittest's main.
_NOT_PREIMPORTED_PARTS = frozenset({"__main__", "test", "tests", "idle_test"})
# Programs carried as string literals inside string literals, at most this deep (the code verifier's
# program holds the candidate's as one literal).
_NESTED_PROGRAM_DEPTH = 2


def _preimport_standard_modules(source: str) -> None:
    """Import the standard modules the program names (as the scorer, before becoming nobody): the
    base interpreter may live under a directory nobody cannot read (a 0700 /root). Only names from
    ``sys.stdlib_module_names``: importing a package the program names would run its code as root."""
    for name in sorted(standard_modules_named(source)):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a submodule name that is really an attribute, or a missing module
            pass


def standard_modules_named(source: str, depth: int = 0) -> set[str]:
    """Standard-library modules (and ``module.name`` pairs that may be submodules) that ``source``
    imports, or that a program in one of its string literals imports: the code verifier's sandboxed
    program is the boundary's code plus ``run_server_main(..., "<the candidate's program>", ...)``,
    and its ``from typing import List`` is what the program needs once it is nobody. Names a program
    could import as root to harm the host (``_NOT_PREIMPORTED``) are left out."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # prose, NUL bytes, absurd nesting
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and type(node.value) is str and depth < _NESTED_PROGRAM_DEPTH:
            names.update(standard_modules_named(node.value, depth + 1))
    return {name for name in names if _may_preimport(name)}


def _may_preimport(name: str) -> bool:
    parts = name.split(".")
    return (parts[0] in sys.stdlib_module_names and parts[0] not in _NOT_PREIMPORTED
            and not _NOT_PREIMPORTED_PARTS.intersection(parts[1:]))


def _tasks_of_real_uid(uid: int) -> int:
    """Processes + threads whose real uid is ``uid``, as RLIMIT_NPROC counts them."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue  # exited meanwhile
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


# --- lock-down steps shared by both modes -----------------------------------------------------------

def _raise_oom_score() -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
    except OSError:
        pass  # best effort: the memory limit is the real bound


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _make_filesystem_read_only() -> None:
    attr = _MountAttr(attr_set=_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
    try:
        _syscall(_SYS_MOUNT_SETATTR, ctypes.c_int(_AT_FDCWD), b"/", ctypes.c_uint(_AT_RECURSIVE),
                 ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    except OSError as error:
        raise SetupFailed(f"remounting / read-only: {error}") from error


class _LandlockRulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _LandlockPathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _apply_landlock(workdir: str | None, isolate_network: bool) -> None:
    """Writes only beneath ``workdir`` (nowhere when None) and to /dev/null; no TCP; scoped signals."""
    abi = landlock_abi()
    if abi < 1:
        raise SetupFailed("Landlock requested but the kernel does not provide it")
    write_rights = _LL_WRITE_RIGHTS_ABI1 | (_LL_REFER if abi >= 2 else 0) | (_LL_TRUNCATE if abi >= 3 else 0)
    attr = _LandlockRulesetAttr(handled_access_fs=write_rights)
    # The struct grew with the ABI; an older kernel rejects a longer struct with non-zero tail fields.
    size = 8
    if abi >= 4 and isolate_network:
        attr.handled_access_net = _LL_NET_BIND_TCP | _LL_NET_CONNECT_TCP  # handled, and no rule allows any port
        size = 16
    if abi >= 6:
        attr.scoped = _LL_SCOPE_ABSTRACT_UNIX_SOCKET | _LL_SCOPE_SIGNAL
        size = 24
    try:
        ruleset = _syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
        if workdir is not None:
            _allow_beneath(ruleset, workdir, write_rights)
        # Programs open /dev/null for writing (subprocess.DEVNULL, logging sinks); it stores nothing.
        _allow_beneath(ruleset, "/dev/null", _LL_WRITE_FILE | (_LL_TRUNCATE if abi >= 3 else 0))
        _syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
        os.close(ruleset)
    except OSError as error:
        raise SetupFailed(f"Landlock: {error}") from error


def _allow_beneath(ruleset: int, path: str, rights: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _LandlockPathBeneathAttr(allowed_access=rights, parent_fd=fd)
        _syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                 ctypes.byref(rule), ctypes.c_uint32(0))
    finally:
        os.close(fd)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str, isolate_network: bool) -> list[tuple[int, int, int, int]]:
    """The BPF program (code, jt, jf, k): kill foreign ABIs, deny ``_DENIED_SYSCALLS`` and socket()
    (but internet families when the network is allowed), allow the rest."""
    audit_arch, socket_nr, foreign_abi_base = _SECCOMP_ARCHES[machine]
    denied = sorted(_DENIED_SYSCALLS[machine].values())
    load_w, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | _EACCES  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO(EACCES)
    kill = 0x80000000  # SECCOMP_RET_KILL_PROCESS
    # seccomp_data: nr at offset 0, arch at 4, args[0] (low half on little-endian) at 16.
    # Jump offsets count the instructions to skip. Layout after the ABI checks:
    # [jeq denied_i → DENY]… [jeq socket → SOCKET RULE] [ALLOW] [DENY] [SOCKET RULE…]
    program = [
        (load_w, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, kill),  # another ABI (i386 via int 0x80)
        (load_w, 0, 0, 0),
        (jge, 0, 1, foreign_abi_base if foreign_abi_base is not None else 0xFFFFFFFF), (ret, 0, 0, kill),
    ]
    program += [(jeq, len(denied) - index + 1, 0, number) for index, number in enumerate(denied)]
    program += [
        (jeq, 2, 0, socket_nr),
        (ret, 0, 0, allow),
        (ret, 0, 0, deny),
        # socket(family, …): internet families pass only when the network is allowed
        (load_w, 0, 0, 16),
        (jeq, 2, 0, _AF_INET if not isolate_network else 0xFFFFFFFF),
        (jeq, 1, 0, _AF_INET6 if not isolate_network else 0xFFFFFFFF),
        (ret, 0, 0, deny),
        (ret, 0, 0, allow),
    ]
    return program


def _apply_seccomp(isolate_network: bool) -> None:
    machine = seccomp_arch()
    if machine is None:
        raise SetupFailed(f"no seccomp filter for architecture {os.uname().machine}")
    program = seccomp_program(machine, isolate_network)
    filters = (_SockFilter * len(program))(*[_SockFilter(*instruction) for instruction in program])
    fprog = _SockFprog(len(program), filters)
    try:
        _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog))
    except OSError as error:
        raise SetupFailed(f"seccomp filter: {error}") from error


def _apply_resource_limits(spec: BootSpec, tasks_already_charged: int) -> None:
    # CPU: SIGXCPU at the soft limit, SIGKILL one second later if the program catches SIGXCPU.
    resource.setrlimit(resource.RLIMIT_CPU, (spec.cpu_seconds, spec.cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (spec.memory_bytes, spec.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec.file_size_bytes, spec.file_size_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (_MAX_OPEN_FILES, _MAX_OPEN_FILES))
    # RLIMIT_NPROC counts every task of the real uid (in this user namespace), not only our children.
    nproc = tasks_already_charged + spec.max_processes
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _lock_down(spec: BootSpec, workdir: str, tasks_already_charged: int) -> None:
    # No exec may gain privileges (setuid binaries, file capabilities); Landlock and seccomp need it.
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if spec.landlock:
        _apply_landlock(workdir, spec.isolate_network)
    if spec.seccomp:
        _apply_seccomp(spec.isolate_network)
    _apply_resource_limits(spec, tasks_already_charged)
    os.chdir(workdir)


def lock_down_scoring_process(*, landlock: bool, seccomp: bool, cpu_seconds: int, memory_bytes: int) -> None:
    """The sandbox's stages for a process forked to score one untrusted answer in the verifier's interpreter
    (``workers.reward.scoring_jail``): no new privileges, Landlock with no writable path, no TCP and
    scoped signals, the seccomp filter with every socket family denied, resource limits (no file may
    grow, no core dumps), and no capabilities. Raises ``SetupFailed`` if a requested layer fails.

    The uid stays what it was: the verifier's interpreter may sit under a 0700 /root, and a scorer
    imports modules lazily (sympy does, deep inside ``simplify``); as uid 0 without capabilities the
    process can still read them, while Landlock (writes, signals, ptrace) and seccomp (sockets) take
    away what uid 0 could otherwise do to the host or to its parent.
    """
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if landlock:
        _apply_landlock(None, isolate_network=True)
    if seccomp:
        _apply_seccomp(isolate_network=True)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (_MAX_OPEN_FILES, _MAX_OPEN_FILES))
    _drop_capabilities()


def die_with_parent() -> None:
    """SIGKILL this process when the thread that forked it ends (PR_SET_PDEATHSIG)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _effective_capabilities() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _drop_capabilities() -> None:
    if _effective_capabilities() == 0:
        return
    with open("/proc/sys/kernel/cap_last_cap") as last:
        last_cap = int(last.read())
    # Bounding set first: an exec by (namespace) root would otherwise regain every capability.
    for cap in range(last_cap + 1):
        _prctl(_PR_CAPBSET_DROP, cap)
    header = _CapHeader(version=_LINUX_CAPABILITY_VERSION_3, pid=0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise SetupFailed(f"capset: {os.strerror(ctypes.get_errno())}")


# --- the program -----------------------------------------------------------------------------------

def _program_environment(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}


def _fork_program(spec: BootSpec, source: str, workdir: str, exposed: bool) -> int:
    pid = os.fork()
    if pid == 0:
        exit_code = 1
        try:
            exit_code = _exec_program(spec, source, workdir, exposed)
        finally:
            os._exit(exit_code)
    _close_fds(spec.keep_fds)
    return pid


def _exec_program(spec: BootSpec, source: str, workdir: str, exposed: bool) -> int:
    """Run ``source`` as ``__main__`` in this (already locked-down) process, as ``python program.py``
    would: exit status from ``SystemExit``, 1 and a traceback for an uncaught exception, atexit hooks."""
    _close_fds([spec.status_fd])
    os.environ.clear()
    os.environ.update(_program_environment(workdir))
    if exposed:  # the minimal root holds the base interpreter, not the virtualenv's
        sys.executable = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    sys.argv = [spec.program]
    sys.path[:] = [path for path in sys.path if path and os.path.isdir(path)]
    main = types.ModuleType("__main__")
    main.__file__ = spec.program
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    exit_code = 0
    try:
        exec(compile(source, spec.program, "exec"), main.__dict__)  # noqa: S102 - this is the sandbox
    except SystemExit as exit_request:
        exit_code = _exit_code_of(exit_request)
    except BaseException:  # noqa: BLE001 - as the interpreter: print it, exit 1
        exit_code = 1
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - e.g. the output file is full (EFBIG)
            pass
    # Never raise from here: this process is a fork of the boot stages, and an exception would run
    # their code (and exit status) instead of the program's.
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    return exit_code


def _exit_code_of(exit_request: SystemExit) -> int:
    code = exit_request.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def _guarded(stage) -> int:
    """Run a stage in a forked process; a set-up failure prints the marker and exits SETUP_FAILED_EXIT."""
    try:
        return stage()
    except (SetupFailed, OSError) as error:
        print(f"{SETUP_FAILED_MARKER} {error}", file=sys.stderr, flush=True)
        return SETUP_FAILED_EXIT
    except BaseException:  # noqa: BLE001 - a forked stage must never return into its parent's code
        traceback.print_exc()
        return SETUP_FAILED_EXIT
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass


def main(argv: list[str]) -> int:
    spec = BootSpec.from_json(argv[1])
    try:
        with open(spec.program, encoding="utf-8") as program:
            source = program.read()
    except OSError as error:
        print(f"{SETUP_FAILED_MARKER} reading the program: {error}", file=sys.stderr, flush=True)
        return SETUP_FAILED_EXIT
    try:
        if spec.namespaces:
            return _run_in_namespaces(spec, source)
        return _run_supervised(spec, source)
    except (SetupFailed, OSError) as error:
        print(f"{SETUP_FAILED_MARKER} {error}", file=sys.stderr, flush=True)
        return SETUP_FAILED_EXIT


if __name__ == "__main__":
    sys.exit(main(sys.argv))
