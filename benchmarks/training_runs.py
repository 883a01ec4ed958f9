"""Short runs of our training loop (``orchestrator.train.train``) and what their ``time/*`` metrics say.

Used by the step-level benchmarks (selection_step, vs_trl, learning_efficiency). Every run writes
into a throw-away folder (checkpoints off, MLflow in a SQLite file there) and uses the embedded Ray
that the benchmark started (``benchmarks.ray_session``).
"""

from __future__ import annotations

import logging
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import require_modules

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

    def steady_steps(self) -> list[dict[str, float]]:
        """Steps after the first (the first pays one-time costs: lazy inits, allocator warm-up)."""
        return self.history[1:] if len(self.history) > 1 else self.history

    def median(self, key: str) -> float | None:
        values = [m[key] for m in self.steady_steps() if key in m]
        return statistics.median(values) if values else None

    def breakdown(self) -> dict[str, float | None]:
        """Median seconds per phase of a steady step, plus the step and the unaccounted rest."""
        phases = {name: self.median(key) for name, key in PHASES.items()}
        step = self.median(STEP_KEY)
        accounted = sum(v for v in phases.values() if v is not None)
        phases["overhead"] = None if step is None else step - accounted
        phases["step"] = step
        return phases


def run_loop(preset: str, overrides: list[str], steps: int, work_dir: Path | None = None) -> LoopRun:
    """``train()`` on ``preset`` + ``overrides`` for ``steps`` RL steps, without checkpoints or periodic evals."""
    import time

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
    logger.info("loop run %s %s: %.0f s", preset, overrides, wall)
    return LoopRun(overrides=overrides, history=result.history, final_metrics=result.final_metrics,
                   wall_seconds=wall)
