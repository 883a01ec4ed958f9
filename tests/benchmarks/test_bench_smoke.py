"""The benchmark suite still runs: ``python -m benchmarks.run --smoke --only NAME`` for each benchmark.

Not a timing test (no figure is checked against a threshold): it proves that every benchmark whose
dependencies exist runs end to end at minimal size and reports figures and settings. A benchmark
whose dependencies do not exist reports ``skipped`` with the reason, and its test is skipped.
One invocation per benchmark, so that CI can deselect the expensive ones with ``-k``: the four that
run the RL loop (selection_step, sweep_efficiency, vs_trl, learning_efficiency) start Ray and a full
set of actors per training run, tens of seconds each on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.run import BENCHMARKS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


def _run_smoke(name: str, out: Path) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    completed = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--only", name, "--out", str(out)],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=840, check=False)
    report_file = out / "latest-smoke.json"
    assert report_file.is_file(), f"no report (exit {completed.returncode}):\n{completed.stderr[-4000:]}"
    assert (out / "latest-smoke.md").read_text().startswith("# gmts-lab benchmarks")
    return json.loads(report_file.read_text())


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_runs_in_smoke_mode(name, tmp_path):
    report = _run_smoke(name, tmp_path)
    assert report["smoke"] is True and report["versions"]["torch"] and report["machine"]["logical_cpus"] >= 1
    entry = report["benchmarks"][name]
    if entry["status"] == "skipped":
        pytest.skip(f"{name}: {entry['reason']}")
    assert entry["status"] == "ok", f"{name} failed:\n{entry.get('reason')}"
    result = entry["result"]
    assert result["figures"], f"{name} reported no figures"
    assert all(fig["name"] and "value" in fig for fig in result["figures"])
    assert result["settings"], f"{name} reported no settings"
