"""Run the benchmark suite and write a JSON + Markdown report.

    python -m benchmarks.run [--smoke] [--only NAME …] [--out benchmarks/results]

Each benchmark runs in its own child process (``--child NAME``): engines, process groups and Ray
sessions die with it, a crash in one does not take the others down, and every benchmark starts
from the same clean state. A benchmark whose dependencies do not exist yet is reported as
``skipped`` with the reason; one that fails is reported as ``error`` with its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from benchmarks.report import BenchmarkUnavailable, machine_info, versions, write_report

# In the order they are built and run: the cheap, self-contained ones first.
BENCHMARKS = (
    "selection_overhead",
    "base_sensitivity",
    "rollout_throughput",
    "weight_sync",
    "cross_node_sync",
    "selection_step",
    "selection_scope",
    "sweep_efficiency",
    "vs_trl",
    "staleness",
    "learning_efficiency",
)
DEFAULT_OUT = Path(__file__).resolve().parent / "results"

logger = logging.getLogger("benchmarks")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="minimal sizes: proves each benchmark runs (minutes)")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, metavar="NAME",
                        help=f"run only these benchmarks; names: {', '.join(BENCHMARKS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report folder (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads of each benchmark process (default: %(default)s; on a shared "
                             "2-core machine 2 threads under load ran 2-6× slower than 1)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds allowed per benchmark (default: none); a benchmark past it is an error")
    parser.add_argument("--child", choices=BENCHMARKS, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.child:
        _exit_without_teardown(_run_child(args.child, args.smoke, args.child_out, args.threads))

    names = [name for name in BENCHMARKS if not args.only or name in args.only]
    started = datetime.now(UTC)
    report = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "smoke": args.smoke,
        "machine": {**machine_info(), "torch_threads": args.threads},
        "versions": versions(),
        "benchmarks": {},
    }
    stem = started.strftime("%Y%m%d-%H%M%S") + ("-smoke" if args.smoke else "")
    for name in names:
        logger.info("=== %s%s", name, " (smoke)" if args.smoke else "")
        entry = _run_in_child(name, args.smoke, args.timeout, args.threads)
        report["benchmarks"][name] = entry
        logger.info("=== %s: %s in %.0f s", name, entry["status"], entry["wall_seconds"])
        # Rewritten after every benchmark: a long suite stopped half-way keeps what it measured.
        json_path, md_path = write_report(report, args.out, stem)
    write_report(report, args.out, "latest-smoke" if args.smoke else "latest")
    print(f"report: {json_path}\n        {md_path}")
    statuses = [entry["status"] for entry in report["benchmarks"].values()]
    return 1 if "error" in statuses else 0


def _run_in_child(name: str, smoke: bool, timeout: float | None, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.run", "--child", name, "--child-out", str(out),
                   "--threads", str(threads)]
        if smoke:
            command.append("--smoke")
        started = time.perf_counter()
        try:
            # A new session: on timeout the whole process group (engine workers included) is ended.
            child = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent, start_new_session=True)
            returncode = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 15)
            child.wait()
            return {"status": "error", "reason": f"timed out after {timeout} s",
                    "wall_seconds": time.perf_counter() - started}
        wall = time.perf_counter() - started
        if not out.is_file():
            return {"status": "error", "reason": f"child exited with code {returncode} and wrote no result",
                    "wall_seconds": wall}
        entry = json.loads(out.read_text())
    entry["wall_seconds"] = wall
    return entry


def _exit_without_teardown(code: int) -> NoReturn:
    """End the child once its result is written, as multiprocessing ends the children it forks (``os._exit``): the
    interpreter's teardown of the torch, vLLM and MLflow modules a benchmark loads costs 1-2 s of CPU per benchmark
    and frees only memory the kernel frees with the process. A Ray session the benchmark left up is stopped first,
    and the logs and output are flushed."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_child(name: str, smoke: bool, out: Path | None, threads: int) -> int:
    import torch

    torch.set_num_threads(threads)
    try:
        module = importlib.import_module(f"benchmarks.{name}")
        result = module.run(smoke=smoke)
        entry = {"status": "ok", "result": result}
    except BenchmarkUnavailable as exc:
        entry = {"status": "skipped", "reason": str(exc)}
    except Exception:  # noqa: BLE001 - the report carries the traceback; the suite goes on
        entry = {"status": "error", "reason": traceback.format_exc()}
    text = json.dumps(entry, indent=2, default=str)
    if out is not None:
        out.write_text(text)
    else:
        print(text)
    if entry["status"] == "error":
        print(entry["reason"], file=sys.stderr)
    return 0 if entry["status"] != "error" else 1


if __name__ == "__main__":
    sys.exit(main())
