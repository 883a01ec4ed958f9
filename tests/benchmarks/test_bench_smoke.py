"""The benchmark suite still runs: ``python -m benchmarks.run --smoke --only NAME`` for each benchmark.

Not a timing test (no figure is checked against a threshold): it proves that every benchmark whose
dependencies exist runs end to end at minimal size and reports figures and settings. A benchmark
whose dependencies do not exist reports ``skipped`` with the reason, and its test is skipped.
One invocation per benchmark, so that CI can deselect the expensive ones with ``-k``: the ones that
run the RL loop (selection_step, sweep_efficiency, vs_trl, staleness, learning_efficiency) start Ray and a
full set of actors per training run, tens of seconds each on 2 cores.

Two invocations at a time: while a benchmark's test waits for its run, the next selected benchmark's run
has started beside it. Each run alone leaves a core idle for much of its time (one process importing, Ray
starting, one trial's driver), and no smoke run checks a timing, so the pair shares the cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from benchmarks.run import BENCHMARKS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


class SmokeRuns:
    """One ``benchmarks.run --smoke --only NAME`` process per benchmark, in the order the tests ask for them; asking
    for one also starts the next, so that at most two run at once. Each writes its report to its own folder and
    its output to a file (a pipe nobody reads while the other test runs could fill up)."""

    def __init__(self, names: list[str], root: Path) -> None:
        self.names, self.root = names, root
        self.running: dict[str, tuple[subprocess.Popen, Path]] = {}

    def report(self, name: str) -> dict:
        at = self.names.index(name)
        for upcoming in self.names[at:at + 2]:
            if upcoming not in self.running:
                self.running[upcoming] = self._start(upcoming)
        proc, out = self.running[name]
        returncode = proc.wait(timeout=840)
        report_file = out / "latest-smoke.json"
        output = (out / "output.txt").read_text()
        assert report_file.is_file(), f"no report (exit {returncode}):\n{output[-4000:]}"
        assert (out / "latest-smoke.md").read_text().startswith("# gmts-lab benchmarks")
        return json.loads(report_file.read_text())

    def _start(self, name: str) -> tuple[subprocess.Popen, Path]:
        out = self.root / name
        out.mkdir()
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
        with open(out / "output.txt", "wb") as output:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.run", "--smoke", "--only", name, "--out", str(out)], cwd=REPO,
                env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        return proc, out

    def stop(self) -> None:
        """Ends what is still running — the run of a test that gave up waiting, or one started for a test that did not
        run (``-x``) — with every descendant: the benchmark's child process has a session of its own (``benchmarks.run``
        ends its whole group on a timeout), and under it its Ray."""
        for proc, _ in self.running.values():
            if proc.poll() is not None:
                continue
            with contextlib.suppress(psutil.NoSuchProcess):  # it may end between the poll and this
                leader = psutil.Process(proc.pid)
                family = [leader, *leader.children(recursive=True)]
                for member in family:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        member.kill()
                psutil.wait_procs(family, timeout=30)
            proc.wait()


@pytest.fixture(scope="module")
def smoke_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    selected = [item.callspec.params["name"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    runs = SmokeRuns(selected, tmp_path_factory.mktemp("smoke"))
    try:
        yield runs
    finally:
        runs.stop()


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_runs_in_smoke_mode(name, smoke_runs):
    report = smoke_runs.report(name)
    assert report["smoke"] is True and report["versions"]["torch"] and report["machine"]["logical_cpus"] >= 1
    entry = report["benchmarks"][name]
    if entry["status"] == "skipped":
        pytest.skip(f"{name}: {entry['reason']}")
    assert entry["status"] == "ok", f"{name} failed:\n{entry.get('reason')}"
    result = entry["result"]
    assert result["figures"], f"{name} reported no figures"
    assert all(fig["name"] and "value" in fig for fig in result["figures"])
    assert result["settings"], f"{name} reported no settings"
