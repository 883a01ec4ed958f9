"""The real-model path end to end: SmolLM2-135M-Instruct on the chat arithmetic task, 3 RL steps.

Real Ray actors, vLLM, DeepSpeed, the math verifier and MLflow, on the preset ``cpu-smollm2-arith`` cut to
its smallest batch (2 prompts × 4 samples, 16-token answers, 8 held-out problems). Three steps show nothing
about learning; they prove that the chat template, the real tokenizer, the verifier and the in-place
weight sync of a 135M-parameter model work together.
"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.config_loader import load_experiment
from orchestrator.train import StepReport, StopTraining, train

pytestmark = pytest.mark.slow


def test_three_steps_of_the_real_model_preset(tmp_path, embedded_ray):
    overrides = {
        "output_dir": str(tmp_path / "runs"), "training.steps": "5", "data.prompts_per_step": "2",
        "rollout.n_samples": "4", "rollout.max_new_tokens": "16",
        # Two optimiser steps per RL step, so the learner takes its own π_old pass and reports its agreement
        # with vLLM's sampling logprobs (one on-policy step with no KL needs neither, and logs no diff).
        "learner.mini_batch_size": "4", "learner.micro_batch_size": "4", "data.eval.arith.limit": "8",
        "evaluation.interval": "0",
    }
    # The model cache stays the default one: the 538 MB SmolLM2 folder is built once per machine.
    config = load_experiment("cpu-smollm2-arith", [f"{k}={v}" for k, v in overrides.items()])
    # Ended after step 3 of 5 by its callback, as benchmarks/real_model.py ends a run whose time budget is spent:
    # the final evaluation still runs, logged at step 3, and the run finishes.
    def stop_after_three(report: StepReport) -> None:
        if report.step == 3:
            raise StopTraining

    result = train(config, on_step=stop_after_three)

    client = MlflowClient(config.tracking_uri())
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and result.steps == 3
    assert run.data.params["model_size"] == "135m"
    history = {m.step: m.value for m in client.get_metric_history(result.run_id, "reward/mean")}
    assert sorted(history) == [1, 2, 3] and all(0.0 <= value <= 1.0 for value in history.values())
    # vLLM and the learner agree on log π of the sampled tokens after every in-place weight sync.
    assert max(m.value for m in client.get_metric_history(result.run_id, "rollout/logprob_diff")) < 1e-3
    accuracy = {m.step: m.value for m in client.get_metric_history(result.run_id, "eval/arith/accuracy")}
    assert sorted(accuracy) == [0, 3] and all(0.0 <= value <= 1.0 for value in accuracy.values())
