"""DeepSpeed's CPU op loader (workers/learner/deepspeed_ops.py): a build folder per venv, and a learner start that
neither races a live build nor waits forever on the lock file of a build that was killed.

Real DeepSpeed and torch builds. The build folder is a copy of this venv's (scripts/setup.sh builds it), so ninja
finds it up to date and the test costs seconds, not a two-minute compile. The killed build is a process that takes
the locks a real build takes (ours, then torch's FileBaton) and is SIGKILLed holding them: killing a real compile at
a chosen moment would make the test depend on how fast the machine compiles.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workers.learner.deepspeed_ops import TORCH_BUILD_LOCK, extensions_dir

OP = "deepspeed_shm_comm"
LOADER = """
from workers.learner.deepspeed_ops import load_cpu_comm_op
print("loaded" if load_cpu_comm_op() is not None else "no op", flush=True)
"""
DYING_BUILD = """
import sys, time
from pathlib import Path
from torch.utils.file_baton import FileBaton
from workers.learner.deepspeed_ops import TORCH_BUILD_LOCK, build_lock
root = Path(sys.argv[1])
(root / "deepspeed_shm_comm").mkdir(parents=True, exist_ok=True)
guard = build_lock(root, "deepspeed_shm_comm")  # kept: a FileLock releases when collected
guard.acquire()
assert FileBaton(str(root / "deepspeed_shm_comm" / TORCH_BUILD_LOCK)).try_acquire()
print("building", flush=True)
time.sleep(600)
"""


def test_the_build_folder_is_this_venvs_unless_torch_extensions_dir_is_set(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert extensions_dir() == Path(sys.prefix) / "torch_extensions"
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(Path(sys.prefix) / "torch_extensions")  # torch reads it itself
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert extensions_dir() == tmp_path


@pytest.fixture
def build_root(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    built = extensions_dir() / OP
    root = tmp_path / "torch_extensions"
    if built.is_dir():
        shutil.copytree(built, root / OP)  # keeps mtimes and ninja's logs: up to date
    return root


def _python(code: str, root: Path) -> subprocess.Popen:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root), "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", code, str(root)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _lines(process: subprocess.Popen) -> queue.Queue:
    """The process's output lines as they come (None at its end), read by a thread: a test can wait with a deadline."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _line_with(lines: queue.Queue, text: str, timeout: float) -> list[str]:
    """The lines up to the first one containing ``text``; fails at the process's end or after ``timeout`` s."""
    seen, deadline = [], time.monotonic() + timeout
    while not seen or text not in seen[-1]:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no line with {text!r} in {timeout} s:\n{''.join(seen)}") from None
        assert line is not None, f"the process ended before saying {text!r}:\n{''.join(seen)}"
        seen.append(line)
    return seen


@pytest.mark.slow  # two real processes: not for `make test-fast`
def test_a_start_waits_for_a_live_build_and_goes_on_when_that_build_is_killed(build_root):
    dying = _python(DYING_BUILD, build_root)
    try:
        assert dying.stdout.readline().strip() == "building"
        torch_lock = build_root / OP / TORCH_BUILD_LOCK
        assert torch_lock.exists()
        waiting = _python(LOADER, build_root)
        try:
            output = _lines(waiting)
            said = _line_with(output, "Waiting for another process's build of deepspeed_shm_comm", timeout=120)
            # It waits at the lock, and keeps waiting while the build lives.
            with pytest.raises(subprocess.TimeoutExpired):
                waiting.wait(timeout=2)
            assert torch_lock.exists(), "a live build's lock was removed"
            dying.kill()
            dying.wait(timeout=30)
            # torch alone would wait on the lock file forever; ours is released with the dead process.
            said += _line_with(output, "loaded", timeout=180)
            waiting.wait(timeout=30)
        finally:
            waiting.kill()
        said = "".join(said)
        assert waiting.returncode == 0, said
        assert "left by a build of deepspeed_shm_comm that died" in said, said
        assert not torch_lock.exists()
    finally:
        dying.kill()
        dying.wait(timeout=30)


@pytest.mark.slow  # a fresh interpreter importing torch and DeepSpeed: seconds
def test_deepspeed_imports_without_mlflow_and_leaves_it_importable():
    """A learner process imports DeepSpeed without the MLflow import its autotuner tries (≈ 1 s of a learner's
    start), and MLflow still imports afterwards, with DeepSpeed whole."""
    probe = """
import sys
from workers.learner.deepspeed_ops import import_deepspeed
deepspeed = import_deepspeed()
from deepspeed.autotuning import autotuner
print("mlflow loaded with deepspeed:", "mlflow" in sys.modules, "autotuner sees it:", autotuner.has_mlflow)
import mlflow
print("mlflow after:", bool(mlflow.__version__), "zero:", hasattr(deepspeed, "zero"))
"""
    done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[3], check=False,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mlflow loaded with deepspeed: False autotuner sees it: False" in done.stdout, done.stdout
    assert "mlflow after: True zero: True" in done.stdout, done.stdout


@pytest.mark.slow  # two fresh interpreters importing torch and DeepSpeed: seconds
def test_the_op_builds_with_pips_ninja_whatever_ninja_the_path_finds_first(build_root, tmp_path):
    """A learner whose ``PATH`` finds another ``ninja`` first (a system one of another version records command lines
    differently: the two rebuilt the op in turn), then one whose ``PATH`` is an activated venv's: the loader never
    runs the other ninja, and the second start loads the first one's build as it is."""
    import ninja

    elsewhere = tmp_path / "bin"
    elsewhere.mkdir()
    called = tmp_path / "other-ninja-ran"
    (elsewhere / "ninja").write_text(f"#!/bin/sh\necho \"$@\" >> {called}\nexit 1\n")
    (elsewhere / "ninja").chmod(0o755)
    probe = LOADER + "import os; print('PATH after:', os.environ['PATH'].split(os.pathsep)[0])\n"

    def start(first_on_path: str) -> int:
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(build_root), "DS_ACCELERATOR": "cpu",
               "PATH": os.pathsep.join([first_on_path, os.environ.get("PATH", "")])}
        done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[3], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert "loaded" in done.stdout and f"PATH after: {first_on_path}" in done.stdout, done.stdout
        return (build_root / OP / "deepspeed_shm_comm.so").stat().st_mtime_ns

    built = start(str(elsewhere))
    assert not called.exists(), called.read_text()
    assert start(ninja.BIN_DIR) == built, "the op was rebuilt"
