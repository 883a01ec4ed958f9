"""DeepSpeed's CPU communication op: built once per virtual environment, and never waited on forever.

On the first ``deepspeed.init_distributed`` of every CPU process DeepSpeed JIT-loads ``deepspeed_shm_comm`` (its
shared-memory allreduce) with torch's ``cpp_extension.load``. Left to torch's defaults that has two traps when
two checkouts (say ``make demo`` in one and the test suite in another) run on one machine:

- torch builds into one folder per user (``~/.cache/torch_extensions/py311_cpu``) whose ``build.ninja`` names the
  venv's include paths, so two checkouts with venvs of their own rebuilt the op in turn: 30–95 s inside each
  learner start of either;
- torch's build lock is a bare file (``torch.utils.file_baton.FileBaton``): a learner killed while building (a
  cancelled job, a test's teardown, Ctrl-C) leaves it, and every later learner start waits on it forever, silently
  (the test suite kills learners on purpose, so a demo beside it would hang in a learner's constructor);
- torch runs whichever ``ninja`` the process's ``PATH`` finds first: the venv's (pip's ``ninja``, which DeepSpeed
  and vLLM require) where the venv is activated, else a system one. Two ninja versions record a command line
  differently in the folder's ``.ninja_log``, so each saw the other's build as out of date and rebuilt the op
  (25–45 s of both cores inside a learner start) whenever processes with and without the venv on ``PATH`` took
  turns: ``make test`` (``.venv/bin/python``, no activation) beside the tests that run the README's commands.

So the op builds in a folder of this venv's own (``<venv>/torch_extensions``; ``TORCH_EXTENSIONS_DIR`` when set),
always with pip's ``ninja``, and only under an OS lock on that folder (``filelock``, released by the kernel when its
holder dies): whoever holds it knows that a torch lock file it finds there was left by a build that died, and removes
it. A start that finds another process building says so before it waits. The op module is
then in DeepSpeed's per-process cache (``OpBuilder._loaded_ops``), so ``init_distributed`` does not load it again.
Processes outside gmts-lab that build in the same folder at the same time would defeat this: do not point their
``TORCH_EXTENSIONS_DIR`` at it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)

TORCH_BUILD_LOCK = "lock"  # the file torch's FileBaton creates in an extension's build folder


def extensions_dir() -> Path:
    """Where torch builds this process's C++ extensions: ``$TORCH_EXTENSIONS_DIR``, else a folder of this venv's.

    ``sys.prefix`` is the venv (Ray workers run the driver's interpreter, so they share it). Set into the
    environment, because torch reads the variable itself at build time."""
    chosen = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path(sys.prefix) / "torch_extensions")
    os.environ["TORCH_EXTENSIONS_DIR"] = chosen
    return Path(chosen)


def import_deepspeed() -> ModuleType:
    """``import deepspeed``, minus the MLflow import that its autotuner (which a learner never runs) tries at import
    time: ≈ 1.1 s of CPU in every learner process, which logs nothing to MLflow (the driver does). Where MLflow is
    loaded already, DeepSpeed finds it as before; after the import, ``import mlflow`` works again."""
    if "deepspeed" in sys.modules or "mlflow" in sys.modules:
        import deepspeed
        return deepspeed
    sys.modules["mlflow"] = None  # an ImportError for `import mlflow`, which the autotuner catches
    try:
        import deepspeed
    finally:
        if sys.modules.get("mlflow", 0) is None:
            del sys.modules["mlflow"]
    return deepspeed


def load_cpu_comm_op():
    """Build (first time) or load DeepSpeed's shared-memory CPU op the way ``init_distributed`` would, returning the
    op module, or None where DeepSpeed would not use one (a GPU accelerator, an incompatible system)."""
    deepspeed = import_deepspeed()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    # The same test as deepspeed.comm.torch.build_shm_op: where it builds nothing, neither do we.
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return None
    root = extensions_dir()
    root.mkdir(parents=True, exist_ok=True)
    guard = build_lock(root, builder.NAME)
    _acquire_saying_why(guard, builder.NAME)
    try:
        # torch's build folder is <TORCH_EXTENSIONS_DIR>/<name> when the variable is set (it always is here).
        leftover = root / builder.NAME / TORCH_BUILD_LOCK
        if leftover.exists():
            logger.warning("Removing %s: left by a build of %s that died (every build here holds %s)",
                           leftover, builder.NAME, guard.lock_file)
            leftover.unlink(missing_ok=True)
        with _pip_ninja_first_on_path():
            return builder.load(verbose=False)
    finally:
        guard.release()


@contextmanager
def _pip_ninja_first_on_path() -> Iterator[None]:
    """``PATH`` with pip's ``ninja`` first while torch builds: one ninja for every process of this venv, whatever
    its ``PATH``. Without the package (DeepSpeed requires it), torch finds whichever it finds."""
    try:
        import ninja
    except ImportError:
        yield
        return
    before = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join(filter(None, [ninja.BIN_DIR, before]))
    try:
        yield
    finally:
        if before is None:
            del os.environ["PATH"]
        else:
            os.environ["PATH"] = before


def _acquire_saying_why(guard: FileLock, name: str) -> None:
    """Take ``guard``; where another process holds it (its build takes minutes, or it died and the kernel is about to
    release the lock), say so first: a learner start would otherwise wait in silence."""
    try:
        guard.acquire(timeout=0)
    except Timeout:
        logger.warning("Waiting for another process's build of %s to finish (it holds %s)", name, guard.lock_file)
        guard.acquire()


def build_lock(root: Path, name: str) -> FileLock:
    """The OS lock every gmts-lab build of extension ``name`` under ``root`` holds."""
    return FileLock(str(root / f".{name}.gmts-lock"))
