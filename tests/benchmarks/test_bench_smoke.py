"""The benchmark suite still runs: ``python -m benchmarks.run --smoke`` once, then one check per benchmark.

Not a timing test (no figure is asserted against a threshold): it proves that every benchmark whose
dependencies exist runs end to end at minimal size and reports its figures. A benchmark whose
dependencies do not exist yet reports ``skipped`` with the reason, and its test is skipped.
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


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    completed = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--out", str(out)], cwd=REPO,
                               env=env, capture_output=True, text=True, timeout=840, check=False)
    report_file = out / "latest-smoke.json"
    assert report_file.is_file(), f"no report (exit {completed.returncode}):\n{completed.stderr[-4000:]}"
    report = json.loads(report_file.read_text())
    assert (out / "latest-smoke.md").read_text().startswith("# gmts-lab benchmarks")
    return report


def test_report_describes_the_machine(smoke_report):
    assert smoke_report["smoke"] is True
    assert smoke_report["machine"]["logical_cpus"] >= 1
    assert smoke_report["versions"]["torch"]
    assert list(smoke_report["benchmarks"]) == list(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_runs_in_smoke_mode(smoke_report, name):
    entry = smoke_report["benchmarks"][name]
    if entry["status"] == "skipped":
        pytest.skip(f"{name}: {entry['reason']}")
    assert entry["status"] == "ok", f"{name} failed:\n{entry.get('reason')}"
    result = entry["result"]
    assert result["figures"], f"{name} reported no figures"
    assert all(fig["name"] and "value" in fig for fig in result["figures"])
    assert result["settings"], f"{name} reported no settings"
