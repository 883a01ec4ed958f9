"""deploy/cuda_core_check.py runs its checks and passes them; on the CPU (at a small shape) in this suite, on a
CUDA device where one is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_cuda_core_check_passes_on_the_cpu(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "deploy/cuda_core_check.py", str(tmp_path)], cwd=ROOT,
                          env={**os.environ, "CUDA_CORE_CHECK_DEVICE": "cpu", "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["ok"] and set(metrics["checks"]) == {
        "token_stats_float32", "token_stats_bfloat16", "gradient_equivalence_float32", "recipes_select_the_same_tokens"}
    assert (tmp_path / "report.md").read_text().startswith("# CUDA core check")
