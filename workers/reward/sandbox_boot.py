"""The first code that runs in a sandbox process: it locks the process down, then runs the program.

Run as a script (``python -I sandbox_boot.py SPEC_JSON``) by ``workers.reward.sandbox``; it uses the
standard library only, because under ``-I`` the project is not importable. The parent imports it
too, for ``BootSpec``, ``landlock_abi`` and ``seccomp_arch``. Every step fails closed: if a requested layer cannot be
set up, the program never runs (exit code ``SETUP_FAILED_EXIT`` and a line starting with
``SETUP_FAILED_MARKER`` on stderr).

Order of the steps, and why:
1. *Outer stage* (before any namespace): when running as root, set the **real** uid to an unused
   uid (``ACCOUNTING_UID``) and keep the effective uid 0. The kernel exempts real uid 0 from
   RLIMIT_NPROC (``copy_process``: ``real_cred->user != INIT_USER``), so without this a fork bomb
   would be unlimited; the effective uid 0 keeps the interpreter readable (it may live under a
   0700 ``/root``). Then exec ``unshare`` (user, mount, PID, IPC, optional network namespaces),
   which starts the inner stage as PID 1 of the new PID namespace.
2. *Inner stage*: raise the OOM score (the OOM killer takes the sandbox first); remount every
   mount read-only, recursively (``mount_setattr``), and mount a size-limited tmpfs on the working
   directory; no-new-privileges; Landlock (writes only in the working directory, no TCP, no signals
   or abstract unix sockets out of the sandbox); a seccomp filter (``socket()`` fails, except
   internet sockets when the network is allowed: a read-only mount does not stop ``connect`` to a
   unix socket file such as Ray's raylet or Docker's, and Landlock does not cover them; nor
   ``io_uring``, which could open sockets past the filter); resource limits; drop every capability
   (bounding set too, so the exec cannot give them back, and so the program cannot undo the
   read-only mounts).
3. Fork the program and wait for it. The boot process stays as PID 1 of the namespace (the kernel
   ignores default-action signals sent to a PID 1, so the program as PID 1 would shrug off SIGXCPU
   at its CPU limit) and reaps orphans; it reports the program's raw wait status on ``status_fd``
   (``unshare`` turns a death by signal into exit code 1), which the program itself never holds.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
from dataclasses import asdict, dataclass

SETUP_FAILED_EXIT = 120
SETUP_FAILED_MARKER = "sandbox setup failed:"
INSIDE_NAMESPACES_FLAG = "--inside-namespaces"
# Real uid charged for the sandbox's processes when the scorer runs as root (see step 1).
ACCOUNTING_UID = 65534

# Syscall numbers shared by x86-64 and arm64 (the generic table numbers these recent syscalls alike).
_SYS_MOUNT_SETATTR = 442
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446

_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_PR_CAPBSET_DROP = 24
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
_SYS_IO_URING_SETUP = 425  # the same number on both
_AF_INET, _AF_INET6 = 2, 10
_EACCES = 13


@dataclass(frozen=True)
class BootSpec:
    """What the parent asks for."""

    program: str
    workdir: str
    unshare_command: list[str]  # empty = no namespaces
    landlock: bool
    seccomp: bool
    isolate_network: bool
    cpu_seconds: int
    memory_bytes: int
    file_size_bytes: int
    max_processes: int
    workdir_bytes: int
    status_fd: int  # write end of the pipe for the program's wait status

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


def landlock_abi() -> int:
    """Landlock ABI version of the running kernel; 0 when Landlock is missing or disabled."""
    try:
        return _syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    except OSError:
        return 0


# --- step 1: outer stage ----------------------------------------------------------------------

def _charge_processes_to_accounting_uid() -> None:
    if os.geteuid() == 0 and os.getuid() == 0:
        # Real uid only: effective and saved uid stay 0, so the capabilities needed for setup remain.
        os.setresuid(ACCOUNTING_UID, 0, 0)


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


# --- step 2: inner stage ----------------------------------------------------------------------

def _raise_oom_score() -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
    except OSError:
        pass  # best effort: the memory limit is the real bound


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _make_filesystem_read_only(workdir: str, workdir_bytes: int) -> None:
    attr = _MountAttr(attr_set=_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
    try:
        _syscall(_SYS_MOUNT_SETATTR, ctypes.c_int(_AT_FDCWD), b"/", ctypes.c_uint(_AT_RECURSIVE),
                 ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    except OSError as error:
        raise SetupFailed(f"remounting / read-only: {error}") from error
    # Mounting on a directory of a read-only filesystem is allowed: the mount writes nothing there.
    options = f"size={workdir_bytes},mode=0700".encode()
    if _libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV), options) != 0:
        errno = ctypes.get_errno()
        raise SetupFailed(f"mounting the tmpfs working directory: {os.strerror(errno)}")


class _LandlockRulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _LandlockPathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _apply_landlock(workdir: str, isolate_network: bool) -> None:
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


def seccomp_arch() -> str | None:
    """The machine name if the seccomp filter knows its syscall numbers, else None."""
    machine = os.uname().machine
    return machine if machine in _SECCOMP_ARCHES else None


def _apply_seccomp(isolate_network: bool) -> None:
    machine = seccomp_arch()
    if machine is None:
        raise SetupFailed(f"no seccomp filter for architecture {os.uname().machine}")
    audit_arch, socket_nr, foreign_abi_base = _SECCOMP_ARCHES[machine]
    load_w, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | _EACCES  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO(EACCES)
    kill = 0x80000000  # SECCOMP_RET_KILL_PROCESS
    # seccomp_data: nr at offset 0, arch at 4, args[0] (low half on little-endian) at 16.
    # Jump offsets count the instructions to skip.
    program = [
        (load_w, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, kill),  # another ABI (i386 via int 0x80)
        (load_w, 0, 0, 0),
        (jge, 0, 1, foreign_abi_base if foreign_abi_base is not None else 0xFFFFFFFF), (ret, 0, 0, kill),
        (jeq, 3, 0, socket_nr),
        (jeq, 0, 1, _SYS_IO_URING_SETUP), (ret, 0, 0, deny),
        (ret, 0, 0, allow),
        # socket(family, …): internet families pass only when the network is allowed
        (load_w, 0, 0, 16),
        (jeq, 2, 0, _AF_INET if not isolate_network else 0xFFFFFFFF),
        (jeq, 1, 0, _AF_INET6 if not isolate_network else 0xFFFFFFFF),
        (ret, 0, 0, deny),
        (ret, 0, 0, allow),
    ]
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
    # RLIMIT_NPROC counts every task of the real uid (in this user namespace), not only our children.
    nproc = tasks_already_charged + spec.max_processes
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


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


def _program_environment(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}


def _lock_down(spec: BootSpec, inside_namespaces: bool) -> None:
    if inside_namespaces:
        # Charged to our real uid in this user namespace: `unshare` (outside the PID namespace) and us.
        tasks_already_charged = 2
        _raise_oom_score()
        _make_filesystem_read_only(spec.workdir, spec.workdir_bytes)
    else:
        tasks_already_charged = _tasks_of_real_uid(os.getuid())  # ourselves included
        _raise_oom_score()
    # No exec may gain privileges (setuid binaries, file capabilities); Landlock and seccomp need it.
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if spec.landlock:
        _apply_landlock(spec.workdir, spec.isolate_network)
    if spec.seccomp:
        _apply_seccomp(spec.isolate_network)
    _apply_resource_limits(spec, tasks_already_charged)
    _drop_capabilities()
    os.chdir(spec.workdir)


def _run_program(spec: BootSpec) -> int:
    """Fork and exec the program, wait for it (reaping orphans meanwhile), report its wait status."""
    program_pid = os.fork()
    if program_pid == 0:
        try:
            os.close(spec.status_fd)
            argv = [sys.executable, "-I", "-B", spec.program]
            os.execve(sys.executable, argv, _program_environment(spec.workdir))
        finally:
            os._exit(127)  # exec failed
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == program_pid:
            break
    os.write(spec.status_fd, f"{status}\n".encode())
    exit_code = os.waitstatus_to_exitcode(status)
    return exit_code if exit_code >= 0 else 128 - exit_code


def main(argv: list[str]) -> int:
    spec = BootSpec.from_json(argv[1])
    inside_namespaces = INSIDE_NAMESPACES_FLAG in argv[2:]
    try:
        if not inside_namespaces:
            _charge_processes_to_accounting_uid()
        if spec.unshare_command and not inside_namespaces:
            command = [*spec.unshare_command, "--", sys.executable, "-I", os.path.abspath(__file__), argv[1],
                       INSIDE_NAMESPACES_FLAG]
            os.execv(command[0], command)
        _lock_down(spec, inside_namespaces)
    except (SetupFailed, OSError) as error:
        print(f"{SETUP_FAILED_MARKER} {error}", file=sys.stderr, flush=True)
        return SETUP_FAILED_EXIT
    return _run_program(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
