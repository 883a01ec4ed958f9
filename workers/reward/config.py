"""How rewards are computed: the verifier process pool, the math time limit and the code sandbox.

Defaults suit a 2-core CPU machine; every limit is per check (one completion), not per batch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SandboxConfig(BaseModel):
    """Limits and isolation of the process that runs a candidate program (code domain).

    Isolation layers (each can be switched off, e.g. to measure what it blocks):
    - ``use_namespaces``: fresh user, mount, PID, IPC (and, with ``isolate_network``, network)
      namespaces; namespace root is host ``nobody`` when the scorer is root; the program sees a
      minimal read-only root (``/usr``, the standard library) and a private size-limited tmpfs as
      its working directory. Falls back (with a warning naming the risk) where they are denied;
      without them a supervisor kills every descendant and, as root, the program runs as ``nobody``.
    - ``use_landlock``: Linux Landlock denies writes outside the working directory, TCP connect/bind
      (with ``isolate_network``) and signals to processes outside the sandbox. Skipped (logged) on
      kernels without Landlock.
    - ``use_seccomp``: a seccomp filter makes ``socket()`` fail — every family with
      ``isolate_network``, else all but internet sockets — so that unix sockets of host services
      (Ray's raylet, Docker) are out of reach; also ``io_uring`` and memory outside the address
      space (``memfd_create``, SysV shm and message queues). x86-64 and arm64.
    The resource limits always apply; see workers/reward/README.md for what each layer blocks.
    """

    model_config = ConfigDict(extra="forbid")

    cpu_seconds: int = Field(5, ge=1, le=600, description="RLIMIT_CPU of each sandboxed process.")
    memory_mb: int = Field(1024, ge=64, le=65536, description="RLIMIT_AS (address space) of each sandboxed process.")
    file_size_mb: int = Field(
        16, ge=1, le=4096, description="RLIMIT_FSIZE: largest file (and captured output) it may write."
    )
    max_processes: int = Field(
        16, ge=1, le=4096,
        description="Processes + threads the program may have at once, itself included (RLIMIT_NPROC).",
    )
    wall_timeout_s: float = Field(
        10.0, gt=0, le=600, description="Wall-clock limit; past it the whole sandbox is killed."
    )
    workdir_mb: int = Field(
        64, ge=1, le=4096, description="Size of the private tmpfs working directory (namespaces only)."
    )
    isolate_network: bool = Field(
        True, description="No network: an empty network namespace, Landlock TCP rules, no socket() (seccomp)."
    )
    use_namespaces: bool = Field(
        True, description="Run inside fresh user/mount/PID/IPC(/net) namespaces when permitted."
    )
    use_landlock: bool = Field(
        True, description="Restrict writes, TCP and signals with Landlock when the kernel has it."
    )
    use_seccomp: bool = Field(
        True, description="Deny socket() (but internet sockets when the network is allowed), io_uring, memfd, SysV IPC."
    )


class RewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_workers: int = Field(
        2, ge=1, le=256,
        description="Verifier processes per scorer (math-verify needs its own process for its timeouts).",
    )
    math_timeout_s: int = Field(
        3, ge=1, le=60,
        description="math-verify's limit for each parse and each comparison (whole seconds: it uses signal.alarm).",
    )
    check_timeout_s: float = Field(
        15.0, gt=0, le=600,
        description=(
            "Hard wall-clock limit of one non-code check (code checks get sandbox.wall_timeout_s plus a grace); "
            "past it the verifier process is killed and replaced, and the completion scores 0 as a timeout."
        ),
    )
    reasoning_gym_partial_credit: bool = Field(
        False,
        description=(
            "Pay reasoning-gym tasks' partial scores. Off: only full marks count, because many tasks pay for an "
            "answer that merely contains the gold one (listing candidates) or 0.01 for any answer."
        ),
    )
    fail_fast_error_fraction: float | None = Field(
        0.95, gt=0, le=1,
        description=(
            "Stop the run (VerifierBroken) when at least this fraction of one batch's checks of a domain end in a "
            "verifier error (timeouts excluded: those are the completion's doing); None never stops."
        ),
    )
    fail_fast_min_checks: int = Field(
        8, ge=1, le=100000, description="A domain's checks in one batch below which fail-fast does not judge."
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)

    @model_validator(mode="after")
    def _hard_limit_leaves_room_for_math_verify(self) -> RewardConfig:
        # A math check is several math-verify steps (parse the reference, parse candidate answers,
        # compare), each bounded by math_timeout_s; the hard limit must not cut a check that is merely
        # slow in a few of them.
        if self.check_timeout_s < 3 * self.math_timeout_s:
            raise ValueError(
                f"check_timeout_s ({self.check_timeout_s}) must be at least 3 × math_timeout_s "
                f"({3 * self.math_timeout_s}): one math check runs several math-verify steps"
            )
        return self
