"""One RLVR training run as a Ray program.

    python -m orchestrator.train --config cpu-tiny-s [--set selection.recipe=ets-release …] [--resume]
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python -m orchestrator.train …

One step, as data (``orchestrator.rl_step``, all in that module):
    prompts → rollout.generate(n) → reward.score → advantages → learners.train_step (π_old / π_ref
    and token selection inside, one call per rank) → weights.push → metrics (→ checkpoint here)
With ``rollout.max_staleness`` k > 0 the first three are those of a batch collected k steps earlier, and the
engines collect the batch of step t+k while the learners train (orchestrator/rollout_ahead.py).
This module keeps the run's lifecycle: start, base evaluation or resume, the steps, the final evaluation, teardown.
"""

# ruff: noqa: E402  (the heavy imports follow the early --help on purpose)
from __future__ import annotations

import argparse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="preset name (e.g. cpu-tiny-s) or YAML file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set selection.recipe=ets-release (repeatable)")
    parser.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    parser.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else an embedded Ray)")
    parser.add_argument("--verbose", action="store_true",
                        help="also print the INFO logs of vLLM, Ray and DeepSpeed (off: phases and the progress display)")
    return parser


# `--help` and usage errors answer here, before the imports below load Ray, torch, transformers,
# DeepSpeed and vLLM (seconds each); main() parses again.
if __name__ == "__main__":
    _parser().parse_args()

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch

from orchestrator import checkpointing
from orchestrator.actors import Workers, start_workers
from orchestrator.base_policy import policy_checksum, prepare_policy
from orchestrator.cluster import connect
from orchestrator.config import ExperimentConfig, UnfindableStore
from orchestrator.config_loader import ConfigError, load_experiment
from orchestrator import console_logs
from orchestrator.progress import ProgressBoard
from orchestrator.data import BUILTIN_SOURCES, PromptSampler, load_dataset
from orchestrator.completion_table import log_completion_tables
from orchestrator.evaluation import (BASE_REFERENCE_FILE, BaseReference, Evaluation, base_metrics, base_reference,
                                     evaluate)
from orchestrator.resources import run_bundles
from orchestrator.rl_step import collect, pad_id, rl_step
from orchestrator.rollout_ahead import RolloutAhead
from orchestrator.run_tracking import RunTracker
from workers.learner.batch import TrainBatch
from workers.models.char_tokenizer import load_tokenizer

logger = logging.getLogger("orchestrator.train")

# How long a run waits for the cluster to hold its placement bundles before it gives up with an error.
PLACEMENT_TIMEOUT_S = 600.0

# Answers of the last batch whose token entropies and gradient norms are saved for the report's scatter.
DIAGNOSTIC_ANSWERS = 64


class StopTraining(Exception):
    """Raised by an ``on_step`` callback to end the run after that step (a time budget spent, a target met):
    the final evaluation still runs, logged at that step, and the run finishes as usual."""


@dataclass
class StepReport:
    step: int
    metrics: dict[str, float]
    checkpoint_dir: Path | None  # set on the steps that saved a checkpoint


@dataclass
class TrainResult:
    run_id: str
    steps: int
    final_metrics: dict[str, float]
    run_dir: Path
    history: list[dict[str, float]] = field(default_factory=list)
    # The evaluations at step 0 (None for a resumed run) and after the last step: per eval set, each problem's
    # completion (greedy, or the first sample) and its reward.
    base_evaluation: Evaluation | None = None
    final_evaluation: Evaluation | None = None


def train(
    config: ExperimentConfig,
    *,
    resume: bool = False,
    on_step: Callable[[StepReport], None] | None = None,
    placement_group=None,
    show_progress: bool = True,
) -> TrainResult:
    """``on_step`` is called after every step; it may raise ``StopTraining`` to end the run there.
    ``show_progress``: this process shows the run's progress (a bar on a terminal, else one line every
    ``training.log_interval`` steps: orchestrator/progress.py); off when a sweep's driver shows it."""
    connect()
    if placement_group is None:
        placement_group = ray.util.get_current_placement_group()
    config.run_dir.mkdir(parents=True, exist_ok=True)
    restored = checkpointing.latest_checkpoint(config.run_dir) if resume else None

    tracker = RunTracker(config, run_id=restored[1]["mlflow_run_id"] if restored else None)
    if restored:
        tracker.reopen()
    run: _Run | None = None
    ahead: RolloutAhead | None = None
    own_group = None
    status = "FAILED"
    board = ProgressBoard(interval=config.training.log_interval) if show_progress else None
    try:
        if placement_group is None and config.resources.colocate:
            # Outside a sweep nobody reserved the pairs' shared bundles: do it here, or Ray could put an
            # engine and its learner on different GPUs.
            own_group = placement_group = _reserve_bundles(config)
        run = _start(config, tracker, board, placement_group, logs_datasets=not restored)
        start_step, loop_state = 0, {}
        if restored:
            start_step, loop_state, run.base = _restore(restored, config, run.workers, run.sampler)
        ahead = RolloutAhead(
            lambda first_group_id: collect(run.sampler, run.workers.rollout, run.workers.score, run.tokenizer, config,
                                           first_group_id),
            config.rollout.max_staleness, next_group_id=loop_state.get("next_group_id", 0),
            held=RolloutAhead.held_from(loop_state))
        if not restored:
            run.evaluate_base()
        history, last_batch, last_step = _steps(run, ahead, start_step, on_step)
        result = _finish(run, history, last_batch, last_step)
        status = "FINISHED"
        return result
    finally:
        if board is not None:
            board.close()
        if ahead is not None:
            ahead.close()
        if run is not None:
            run.workers.shutdown()
        if own_group is not None:
            ray.util.remove_placement_group(own_group)
        tracker.finish(status)


@dataclass
class _Run:
    """What the phases of one run share: its config, tracker and workers, the data, and its evaluations so far."""

    config: ExperimentConfig
    tracker: RunTracker
    board: ProgressBoard | None
    phase: _Phases
    tokenizer: Any
    sampler: PromptSampler
    eval_sets: dict
    workers: Workers
    base: BaseReference | None = None  # the base's answers, once recorded (step 0, or the resumed run's file)
    evaluations: dict[str, Evaluation] = field(default_factory=dict)  # "base" / "last"

    def evaluate(self, step: int, when: str, timed: bool = False) -> dict[str, float]:
        with self.phase(f"evaluating {when} on {', '.join(self.eval_sets) or 'no eval set'}", timed=timed):
            evaluation = evaluate(self.eval_sets, self.workers.rollout, self.workers.score, self.tokenizer,
                                  self.config.data.prompt_template, self.config.evaluation, self.base,
                                  self.workers.learners)
        self.evaluations["last"] = evaluation
        log_completion_tables(self.tracker, step, self.eval_sets, evaluation, self.config.evaluation.shown_completions)
        return evaluation.metrics

    def evaluate_base(self) -> None:
        """Step 0: the base policy's evaluation, logged, and its answers recorded for later comparisons."""
        with self.phase(f"evaluating the base policy (step 0) on {', '.join(self.eval_sets) or 'no eval set'}"):
            initial, self.base = _evaluate_base(self.config, self.workers, self.eval_sets, self.tokenizer)
        self.evaluations["base"] = initial
        log_completion_tables(self.tracker, 0, self.eval_sets, initial, self.config.evaluation.shown_completions)
        self.tracker.log_step(0, initial.metrics)
        if self.board is not None:
            self.board.update(self.config.name, self.phase.who, self.config.training.steps, 0, initial.metrics)


def _start(config: ExperimentConfig, tracker: RunTracker, board: ProgressBoard | None, placement_group,
           logs_datasets: bool) -> _Run:
    """The base policy (built on first use), the data, and the rollout engines, learners and reward worker."""
    phase = _Phases(config)
    with phase("preparing the base policy (warm-up on first use, cached after)"):
        policy_dir = prepare_policy(config)
    tracker.log_base_checksum(policy_checksum(config, policy_dir))
    tokenizer = load_tokenizer(policy_dir)
    train_problems = load_dataset(config.data.train)
    sampler = PromptSampler(train_problems, config.data.prompts_per_step, seed=config.training.seed)
    eval_sets = {name: load_dataset(spec) for name, spec in config.data.eval.items()}
    if logs_datasets:
        tracker.log_datasets((_dataset_name(config.data.train), train_problems), eval_sets)
    with phase("starting the rollout engines, learners and reward worker"):
        workers = start_workers(config, policy_dir, placement_group)
    return _Run(config=config, tracker=tracker, board=board, phase=phase, tokenizer=tokenizer, sampler=sampler,
                eval_sets=eval_sets, workers=workers)


def _steps(run: _Run, ahead: RolloutAhead, start_step: int, on_step: Callable[[StepReport], None] | None
           ) -> tuple[list[dict[str, float]], TrainBatch | None, int]:
    """Steps ``start_step + 1`` … the last (or the one ``on_step`` stopped at), each logged, evaluated and
    checkpointed on its interval; their metrics, the last step's batch and the last step."""
    config, workers, tracker = run.config, run.workers, run.tracker
    history: list[dict[str, float]] = []
    batch: TrainBatch | None = None
    for step in range(start_step + 1, config.training.steps + 1):
        step_started = time.perf_counter()
        metrics, batch = rl_step(step, config, workers, ahead, run.tokenizer, batch)
        if config.evaluation.interval and step % config.evaluation.interval == 0 and step < config.training.steps:
            metrics.update(run.evaluate(step, f"at step {step}"))
        metrics["reward/failures_total"] = float(workers.reward_failures)
        metrics["time/step"] = time.perf_counter() - step_started
        tracker.log_step(step, metrics)
        history.append(metrics)
        if run.board is not None:
            run.board.update(config.name, run.phase.who, config.training.steps, step, metrics)

        saved = None
        if config.checkpoint.interval and step % config.checkpoint.interval == 0:
            saved = _save(config, workers, run.sampler, step, ahead, tracker)
        elif not config.checkpoint.interval:
            tracker.flush()
        if on_step is not None:
            try:
                on_step(StepReport(step=step, metrics=metrics, checkpoint_dir=saved))
            except StopTraining:
                logger.info("%s: stopped by its on_step callback after step %d of %d", run.phase.who, step,
                            config.training.steps)
                return history, batch, step
    return history, batch, config.training.steps


def _finish(run: _Run, history: list[dict[str, float]], batch: TrainBatch | None, last_step: int) -> TrainResult:
    """The evaluation after the last step, the token diagnostics of its batch, and the run's result."""
    final = run.evaluate(last_step, f"after the last step ({last_step})", timed=True)
    run.tracker.log_step(last_step, final)
    logger.info("%s final | %s", run.config.name, _fmt(final))
    if batch is not None:
        # The paper's motivating figure: entropy vs exact gradient norm, token by token.
        sample = batch.select(torch.arange(min(DIAGNOSTIC_ANSWERS, batch.batch_size)))
        run.tracker.log_json({"answers": run.workers.learners.token_statistics(sample)}, "diagnostics/token_stats.json")
    return TrainResult(run_id=run.tracker.run_id, steps=last_step, final_metrics=final, run_dir=run.config.run_dir,
                       history=history, base_evaluation=run.evaluations.get("base"),
                       final_evaluation=run.evaluations["last"])


def _restore(restored: tuple[Path, dict], config: ExperimentConfig, workers: Workers, sampler: PromptSampler
             ) -> tuple[int, dict, BaseReference | None]:
    """A resumed run's learner, sampler and engines at its checkpoint; returns its step, the rollout loop's state
    (next group id, batches held ahead: ``RolloutAhead.state_dict``) and the base's recorded answers (None if the
    run never recorded them)."""
    folder, state = restored
    workers.learners.load_checkpoint(folder, node_local=config.checkpoint.node_local)
    sampler.load_state_dict(state["sampler"])
    workers.weights.push()
    base_file = config.run_dir / BASE_REFERENCE_FILE
    base = BaseReference.load(base_file) if base_file.is_file() else None
    logger.info("Resumed from %s (step %d)", folder, state["step"])
    return state["step"], state, base


def _evaluate_base(config: ExperimentConfig, workers: Workers, eval_sets: dict, tokenizer
                   ) -> tuple[Evaluation, BaseReference | None]:
    """Step 0: the base policy's evaluation (its metrics with the ``base/`` copies), whose answers are also
    recorded for later comparisons with it."""
    initial = evaluate(eval_sets, workers.rollout, workers.score, tokenizer, config.data.prompt_template,
                       config.evaluation)
    base = None
    if config.evaluation.compare_to_base and eval_sets:
        base = base_reference(eval_sets, initial.answers, workers.rollout, workers.learners, tokenizer,
                              config.data.prompt_template, config.evaluation, pad_id(tokenizer))
        base.save(config.run_dir / BASE_REFERENCE_FILE)
    initial.metrics.update(base_metrics(initial.metrics))
    return initial, base


class _Phases:
    """Announces the slow start-up and evaluation phases of a run (seconds to minutes each, silent otherwise)
    with how long each took: "t000 (GMTS-release top-20 % · seed 0): starting the rollout engines … 41 s"."""

    def __init__(self, config: ExperimentConfig) -> None:
        label = config.tracking.run_name
        self.who = config.name if not label or label == config.name else f"{config.name} ({label})"

    @contextlib.contextmanager
    def __call__(self, what: str, *, timed: bool = True):
        """``timed``: also say when it ended and how long it took (not for the evaluations between steps,
        whose step line follows at once)."""
        logger.info("%s: %s …", self.who, what)
        started = time.perf_counter()
        yield
        if timed:
            logger.info("%s: %s — done in %.0f s", self.who, what, time.perf_counter() - started)


def _dataset_name(spec) -> str:
    """The train set's name in MLflow: its source (a built-in name or a file's stem) and split."""
    source = Path(spec.source).stem if spec.source not in BUILTIN_SOURCES else spec.source
    return f"{source}-{spec.resolved_split}"


def _reserve_bundles(config: ExperimentConfig, timeout_s: float = PLACEMENT_TIMEOUT_S):
    bundles = run_bundles(config)
    group = ray.util.placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(group)
        raise RuntimeError(f"resources: the cluster did not hold this run's bundles {bundles} within "
                           f"{timeout_s:.0f} s (cluster resources: {ray.cluster_resources()})")
    return group


def _save(config: ExperimentConfig, workers: Workers, sampler: PromptSampler, step: int, ahead: RolloutAhead,
          tracker: RunTracker) -> Path:
    folder = checkpointing.step_dir(config.run_dir, step)
    workers.learners.save_checkpoint(folder, node_local=config.checkpoint.node_local)
    checkpointing.write_run_state(folder, {"step": step, **ahead.state_dict(), "sampler": sampler.state_dict(),
                                           "mlflow_run_id": tracker.run_id})
    # Metrics go to MLflow only once the checkpoint that covers them exists (see run_tracking.py).
    tracker.flush()
    checkpointing.prune(config.run_dir, config.checkpoint.keep_last)
    return folder


def _fmt(metrics: dict[str, float]) -> str:
    keys = [k for k in metrics if k.startswith(("eval/", "train/accuracy", "reward/", "selection/selected", "time/step"))]
    return " ".join(f"{k}={metrics[k]:.3g}" for k in keys)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console_logs.configure(verbose_logs=args.verbose)
    try:
        config = load_experiment(args.config, args.overrides)
        config.tracking_uri()  # refuses a store in Ray's temporary job folder before anything starts
    except (ConfigError, UnfindableStore) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    connect(args.address)
    result = train(config, resume=args.resume)
    print(f"run {result.run_id} finished: " + " ".join(f"{k}={v:.4f}" for k, v in sorted(result.final_metrics.items())))
    print(f"MLflow: mlflow ui --backend-store-uri {config.tracking_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
