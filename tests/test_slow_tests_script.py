"""scripts/slow_tests.py: which unmarked test functions keep `make test-fast` from its minute."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

SCRIPT = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "slow_tests.py"))

LOG = """\
============================= slowest durations ==============================
0.30s call     tests/a.py::test_param[x]
0.25s call     tests/a.py::test_param[y]
0.20s setup    tests/b.py::test_one
0.10s call     tests/b.py::test_one
1.50s call     tests/c.py::TestThing::test_method
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
958 passed in 41.2s
"""


def test_parametrizations_and_phases_add_up_per_function():
    totals = SCRIPT["seconds_by_function"](LOG)
    assert totals == pytest.approx({"tests/a.py::test_param": 0.55, "tests/b.py::test_one": 0.3,
                                    "tests/c.py::TestThing::test_method": 1.5})


def test_only_functions_over_the_threshold_are_listed_slowest_first():
    totals = SCRIPT["seconds_by_function"](LOG)
    assert [name for name, _ in SCRIPT["over"](totals, 0.4)] == ["tests/c.py::TestThing::test_method",
                                                                  "tests/a.py::test_param"]
    assert SCRIPT["over"](totals, 2.0) == []
