"""Short runs of our training loop (``orchestrator.train.train``) and what their ``time/*`` metrics say.

Used by the step-level benchmarks (selection_step, vs_trl, learning_efficiency). Every run writes
into a throw-away folder (checkpoints off, MLflow in a SQLite file there) and uses the embedded Ray
that the benchmark started (``benchmarks.ray_session``).
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.report import require_modules

if TYPE_CHECKING:  # torch-free at import, like the rest of this module's heavy imports
    from orchestrator.evaluation import Evaluation

logger = logging.getLogger(__name__)

LOOP_MODULES = ("orchestrator.train", "workers.learner.group", "workers.reward.actor", "workers.rollout.actor")

# Phases of one step as the loop reports them; "overhead" is the step minus their sum (Ray calls,
# batching, advantage computation, logging).
PHASES = {"rollout": "time/rollout", "reward": "time/reward", "learner": "time/train_step_s", "sync": "time/sync"}
STEP_KEY = "time/step"


def require_loop() -> None:
    require_modules(*LOOP_MODULES)


@dataclass
class LoopRun:
    overrides: list[str]
    history: list[dict[str, float]]
    final_metrics: dict[str, float]
    wall_seconds: float
    initial_metrics: dict[str, float] = field(default_factory=dict)  # the step-0 evaluation (run_loop_for_seconds)
    budget_reached: bool | None = None  # run_loop_for_seconds: stopped by its budget (False: by its step cap)
    base_evaluation: Evaluation | None = None  # step 0's answers and rewards (orchestrator.train.TrainResult)
    final_evaluation: Evaluation | None = None  # the last step's

    @property
    def rl_seconds(self) -> float:
        """The RL steps' own time (Σ time/step): rollout, reward, learner, sync, the loop's overhead; no
        evaluation, no actor start-up, no checkpoint writes."""
        return sum(step.get(STEP_KEY, 0.0) for step in self.history)

    def steady_steps(self) -> list[dict[str, float]]:
        """Steps after the first (the first pays one-time costs: lazy inits, allocator warm-up)."""
        return self.history[1:] if len(self.history) > 1 else self.history

    def median(self, key: str) -> float | None:
        values = [m[key] for m in self.steady_steps() if key in m]
        return statistics.median(values) if values else None

    def breakdown(self) -> dict[str, float | None]:
        """Median seconds per phase of a steady step, plus the step and the unaccounted rest."""
        return step_breakdown(self.steady_steps())


def step_breakdown(steps: list[dict[str, float]]) -> dict[str, float | None]:
    """Median seconds of each phase over ``steps``, of the whole step, and of the rest ("overhead").

    The rest is computed step by step (step − Σ phases of that step) before taking its median:
    medians do not add, so the median step minus the phase medians could even come out negative.
    """
    def median_of(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    out: dict[str, float | None] = {name: median_of([s[key] for s in steps if key in s])
                                    for name, key in PHASES.items()}
    timed = [s for s in steps if STEP_KEY in s]
    out["overhead"] = median_of([s[STEP_KEY] - sum(s.get(key, 0.0) for key in PHASES.values()) for s in timed])
    out["step"] = median_of([s[STEP_KEY] for s in timed])
    return out


def run_loop(preset: str, overrides: list[str], steps: int, work_dir: Path | None = None) -> LoopRun:
    """``train()`` on ``preset`` + ``overrides`` for ``steps`` RL steps, without checkpoints or periodic evals."""
    from orchestrator.config_loader import load_experiment
    from orchestrator.train import train

    with tempfile.TemporaryDirectory(prefix="bench-run-", dir=work_dir) as tmp:
        everything = [
            f"training.steps={steps}", "evaluation.interval=0", "checkpoint.interval=0",
            f"output_dir={tmp}", f"tracking.tracking_uri=sqlite:///{tmp}/mlflow.db", "name=bench",
            *overrides,
        ]
        config = load_experiment(preset, everything)
        started = time.perf_counter()
        result = train(config)
        wall = time.perf_counter() - started
        initial = _step_zero_metrics(f"sqlite:///{tmp}/mlflow.db", result.run_id)
    logger.info("loop run %s %s: %.0f s", preset, overrides, wall)
    return LoopRun(overrides=overrides, history=result.history, final_metrics=result.final_metrics,
                   wall_seconds=wall, initial_metrics=initial, base_evaluation=result.base_evaluation,
                   final_evaluation=result.final_evaluation)


def _step_zero_metrics(tracking_uri: str, run_id: str) -> dict[str, float]:
    """What the run logged before its first update: the base's evaluation (``eval/…`` and ``base/…``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    return {key: metric.value for key in client.get_run(run_id).data.metrics if key.startswith(("eval/", "base/"))
            for metric in client.get_metric_history(run_id, key) if metric.step == 0}


def run_loop_for_seconds(preset: str, overrides: list[str], budget_seconds: float, max_steps: int,
                         work_dir: Path | None = None) -> LoopRun:
    """``train()`` until its RL steps' own time (Σ ``time/step``) reaches ``budget_seconds``, then its final
    evaluation; at most ``max_steps`` steps, no periodic evaluation, no checkpoints.

    The ``on_step`` callback raises ``StopTraining`` at the first step that brings the budget to zero, so the
    budget is overrun by less than one step; the run reports the RL seconds it actually used. Start-up and
    the evaluations are outside the budget (``wall_seconds`` has them).
    """
    from orchestrator.config_loader import load_experiment
    from orchestrator.train import StopTraining, train

    history: list[dict[str, float]] = []

    def on_step(report) -> None:  # report: orchestrator.train.StepReport
        history.append(report.metrics)
        if sum(step.get(STEP_KEY, 0.0) for step in history) >= budget_seconds:
            raise StopTraining

    with tempfile.TemporaryDirectory(prefix="bench-run-", dir=work_dir) as tmp:
        config = load_experiment(preset, [
            f"training.steps={max_steps}", "evaluation.interval=0", "checkpoint.interval=0", f"output_dir={tmp}",
            f"tracking.tracking_uri=sqlite:///{tmp}/mlflow.db", "name=bench", *overrides])
        started = time.perf_counter()
        result = train(config, on_step=on_step)
        wall = time.perf_counter() - started
        initial = _step_zero_metrics(f"sqlite:///{tmp}/mlflow.db", result.run_id)
    run = LoopRun(overrides=overrides, history=history, final_metrics=result.final_metrics, wall_seconds=wall,
                  initial_metrics=initial, base_evaluation=result.base_evaluation,
                  final_evaluation=result.final_evaluation)
    run.budget_reached = run.rl_seconds >= budget_seconds
    logger.info("loop run %s %s: %d steps, %.0f s of RL, %.0f s in all", preset, overrides, len(history),
                run.rl_seconds, wall)
    return run


def rl_step_shape(preset: str, overrides: list[str]) -> dict[str, int]:
    """What one RL step of ``preset`` + ``overrides`` does: prompts, sequences, optimiser steps (for the report)."""
    from orchestrator.config_loader import load_experiment

    config = load_experiment(preset, overrides)
    sequences = config.data.prompts_per_step * config.rollout.n_samples
    return {"prompts": config.data.prompts_per_step, "samples_per_prompt": config.rollout.n_samples,
            "mini_batch_size": config.learner.mini_batch_size, "micro_batch_size": config.learner.micro_batch_size,
            "optimiser_steps": config.learner.ppo_epochs * max(1, sequences // config.learner.mini_batch_size)}
