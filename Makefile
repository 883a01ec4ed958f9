# The two commands of the README:  make demo  |  make test
PY := .venv/bin/python
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup demo test test-fast bench bench-smoke clean

setup:
	bash scripts/setup.sh

## Run the main job on the embedded default: the CPU demo sweep (local Ray, local MLflow store).
demo: setup
	$(PY) -m sweeps.run cpu-demo

## The whole test suite, slow end-to-end tests included (what CI runs).
test: setup
	$(PY) -m pytest -q --durations=25

## The quick loop, under a minute: what starts no engine, cluster, process group, server, driver or sandboxed
## program and takes no more than ≈ 0.4 s (the rest is marked slow; CI runs all).
test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) -m benchmarks.run

bench-smoke: setup
	$(PY) -m benchmarks.run --smoke

clean:
	rm -rf runs .pytest_cache
