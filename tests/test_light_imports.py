"""`--help` and `sweeps.report` must not load the heavy libraries (each costs seconds to import): a fresh
interpreter runs the command and reports which of them it loaded."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "vllm", "deepspeed", "ray", "mlflow", "matplotlib")

PROBE = """
import runpy, sys
sys.argv = [{module!r}, *{args!r}]
try:
    runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
print("loaded:", *(name for name in {heavy!r} if name in sys.modules))
"""


def _loaded(module: str, *args: str) -> list[str]:
    code = PROBE.format(module=module, args=list(args), heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    last = out.strip().splitlines()[-1].split()
    assert last[0] == "loaded:", out
    return last[1:]


@pytest.mark.slow
@pytest.mark.parametrize("module,args", [
    ("orchestrator.train", ["--help"]),
    ("sweeps.run", ["--help"]),
    ("sweeps.report", ["--help"]),
    ("benchmarks.run", ["--help"]),
    ("api.cli", ["--help"]),
    ("api.cli", ["sweep", "submit", "--help"]),
])
def test_help_loads_no_heavy_library(module, args):
    assert _loaded(module, *args) == []


@pytest.mark.slow
def test_the_report_reads_mlflow_without_torch_transformers_or_ray():
    code = ("import sys, sweeps.report; "
            "print(' '.join(n for n in ('torch', 'transformers', 'vllm', 'deepspeed', 'ray') if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == []
