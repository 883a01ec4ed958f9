"""Every paper preset against the GMTS paper's appendix A.3, transcribed here as a table."""

import pytest

from orchestrator.config_loader import load_experiment

MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# A.3: questions per RL step, questions per mini-batch (one optimiser step), learning rate, template.
A3 = {
    "qwen2.5-math-1.5b": (64, 64, 3e-5, "math"),
    "qwen2.5-math-7b": (64, 64, 3e-5, "math"),
    "qwen3-8b": (512, 32, 1e-6, "math"),
    "qwen2.5-1.5b": (512, 32, 1e-6, "math"),
    "qwen2.5-7b": (512, 32, 1e-6, "math"),
    "qwen2.5-coder-1.5b": (512, 32, 1e-6, "code"),
    "qwen2.5-coder-7b": (512, 32, 1e-6, "code"),
}
ROLLOUTS, TEMPERATURE, CLIP = 16, 1.0, (0.2, 0.28)


@pytest.mark.parametrize("preset", sorted(A3))
@pytest.mark.parametrize("algorithm", ["grpo", "dapo"])
def test_paper_preset_matches_appendix_a3(gpu_roots, preset, algorithm):
    questions, mini_questions, lr, template = A3[preset]
    config = load_experiment(preset, [f"algorithm.name={algorithm}"])
    assert config.data.prompts_per_step == questions
    assert config.rollout.n_samples == ROLLOUTS and config.rollout.temperature == TEMPERATURE
    assert config.learner.mini_batch_size == mini_questions * ROLLOUTS
    steps_per_batch = questions // mini_questions
    assert questions * ROLLOUTS // config.learner.mini_batch_size == steps_per_batch == (1 if questions == 64 else 16)
    assert config.learner.lr == lr and config.learner.lr_warmup_steps == 0 and config.learner.ppo_epochs == 1
    assert (config.algorithm.loss.clip_low, config.algorithm.loss.clip_high) == CLIP
    assert config.training.seed == 0
    prompt = config.data.prompt_template
    if template == "math":
        assert prompt.system_prompt == MATH_SYSTEM and prompt.instructions["math"] == ""
    else:
        assert prompt.system_prompt == QWEN_SYSTEM and "self-contained Python script" in prompt.instructions["code"]
    # The paper's own comparison: the GMTS release's setting (the specs run ets-release beside it).
    assert config.selection.recipe == "gmts-release" and config.selection.ratio == 0.2
