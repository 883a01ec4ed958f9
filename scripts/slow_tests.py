"""List the test functions that ``make test-fast`` runs but should not: those over the slow threshold.

``make test-fast`` must give its verdict in under a minute, so any test function whose runs (all its
parameters together) take more than the threshold belongs under ``@pytest.mark.slow``. Reads the timings
of a ``pytest -m "not slow" --durations=0`` run, from a log file or from a run it starts itself:

    python scripts/slow_tests.py                  # runs the quick loop once, then lists
    python scripts/slow_tests.py fast.log --threshold 0.4
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

DURATION_LINE = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+)")
DEFAULT_THRESHOLD_S = 0.4
REPO = Path(__file__).resolve().parents[1]


def seconds_by_function(log: str) -> dict[str, float]:
    """Setup, call and teardown seconds of every test function, its parametrizations summed."""
    totals: dict[str, float] = defaultdict(float)
    for line in log.splitlines():
        match = DURATION_LINE.match(line)
        if match:
            totals[match.group(2).split("[", 1)[0]] += float(match.group(1))
    return dict(totals)


def over(totals: dict[str, float], threshold_s: float) -> list[tuple[str, float]]:
    return sorted(((name, s) for name, s in totals.items() if s > threshold_s), key=lambda item: -item[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", nargs="?", type=Path, help="output of pytest -m 'not slow' --durations=0 (default: run it)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD_S, help="seconds (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.log is None:
        log = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "--durations=0", "-p", "no:cacheprovider"],
                             cwd=REPO, capture_output=True, text=True, check=False).stdout
    else:
        log = args.log.read_text()
    totals = seconds_by_function(log)
    slow = over(totals, args.threshold)
    for name, seconds in slow:
        print(f"{seconds:7.2f} s  {name}")
    print(f"{len(slow)} unmarked test functions over {args.threshold} s; the quick loop's tests take {sum(totals.values()):.0f} s "
          "in all", file=sys.stderr)
    return 1 if slow else 0


if __name__ == "__main__":
    raise SystemExit(main())
