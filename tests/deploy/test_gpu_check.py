"""deploy/gpu_check.sh runs on GPU machines only; here: it parses, and its run is a valid configuration."""

import ast
import re
import subprocess
from pathlib import Path

from orchestrator.config_loader import load_experiment

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "gpu_check.sh"


def test_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_overrides_make_a_valid_experiment_on_the_gpu_path():
    literal = re.search(r"^overrides = (\{.*?^\})$", SCRIPT.read_text(), re.DOTALL | re.MULTILINE).group(1)
    overrides = ast.literal_eval(literal)
    config = load_experiment("cpu-smollm2", [f"{k}={v}" for k, v in overrides.items()])
    assert config.model.source == "smollm2" and config.selection.method == "gmts"
    assert config.algorithm.name == "grpo" and config.rollout.weight_sync == "collective"
    assert config.learner.bf16 and config.learner.max_tokens_per_micro_batch
    # Both actors fit on the one GPU.
    assert config.resources.gpus_per_rollout_actor + config.resources.gpus_per_learner_actor <= 1
