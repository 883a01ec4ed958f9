"""ETS vs GMTS on a real pretrained LM: SmolLM2-135M-Instruct on ``cpu-smollm2-arith``, for the same RL time or steps.

    python -m benchmarks.real_model [--seeds 0,1] [--budget-s 480 | --steps 6] [--journal FILE.jsonl] [--out DIR]
    python -m benchmarks.real_model --smoke     # one seed, one step per arm, the smallest batch: minutes

Three arms, each the published convention of its method at ρ = 0.2, top: ``none`` (every token),
``ets-release`` (ETS over the optimiser step's mini-batch) and ``gmts-release`` (GMTS within each prompt
group) — the GMTS release's recipes (workers/learner/recipes.py), the same arms as learning_efficiency.
Every arm trains the preset (GRPO, lr 2e-5, 8 prompts × 8 samples, no KL) from the same base model, then the
held-out greedy evaluation (118 problems, never trained on). Two ways to make the arms' training equal:

- ``--budget-s`` (the default, 480 s): the same *RL time*. Steps run until Σ ``time/step`` (rollout, reward,
  learner, weight sync) reaches the budget, so a method that makes a step dearer gets fewer steps; start-up
  and evaluations are outside the budget. Only meaningful on a quiet machine: on a shared one the step time
  follows the other jobs (measured: one arm got 9 steps, the next 4, with a test suite started beside it).
- ``--steps N``: the same number of RL steps, whatever the load; each run's median step time is reported,
  so the cost of a method per step can still be read (as a ratio between arms of the same run).

Runs are interleaved seed by seed, arms rotated one place per seed (so a change in the machine's speed
during the benchmark does not fall on one arm). ``training.seed`` sets prompt order and rollout sampling,
so within a seed every arm sees the same first batch (the report checks it). Accuracy per arm is the mean
over seeds with its Student-t 95 % interval (wide with 2-3 seeds), and, per run, the binomial 95 % interval
over the 118 problems; differences between arms are paired by seed. ``--journal`` keeps every finished run
(a crash or a stop loses only the run under way) and reuses the runs it holds, so seeds can be added later.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.learning_efficiency import ARMS as LEARNING_EFFICIENCY_ARMS
from benchmarks.learning_efficiency import FIRST_STEP_KEYS, Arm, RunJournal, seed_check_figures
from benchmarks.report import BenchmarkResult, Figure, cpu_kind, machine_info, versions, write_report
from benchmarks.training_runs import LoopRun, require_loop, rl_step_shape, run_loop, run_loop_for_seconds
from sweeps.statistics import paired_comparisons, t_interval

logger = logging.getLogger("benchmarks.real_model")

PRESET = "cpu-smollm2-arith"
TEST_SET = "arith"
TEST_METRIC = f"eval/{TEST_SET}/accuracy"
LENGTH_METRIC = f"eval/{TEST_SET}/response_length"
ARMS: tuple[Arm, ...] = tuple(arm for arm in LEARNING_EFFICIENCY_ARMS
                              if arm.name in ("none", "ets-release", "gmts-release"))
COMPARISONS = (("gmts-release", "ets-release"), ("gmts-release", "none"), ("ets-release", "none"))
DEFAULT_SEEDS = (0, 1)
DEFAULT_BUDGET_S = 480.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
SHOWN_ANSWERS = 16  # held-out problems whose answers each run records (base and trained)
# --smoke: the preset at the smallest batch of its CI test (tests/orchestrator/test_train_smollm2.py).
SMOKE_OVERRIDES = ("data.prompts_per_step=2", "rollout.n_samples=4", "rollout.max_new_tokens=16",
                   "learner.mini_batch_size=8", "learner.micro_batch_size=8", f"data.eval.{TEST_SET}.limit=8")


def run_grid(seeds: list[int], journal: RunJournal | None, *, budget_s: float | None = None, max_steps: int = 30,
             steps: int | None = None, extra: tuple[str, ...] = ()) -> list[dict]:
    """Every (seed, arm) run, in the interleaved order, each reused from the journal when it holds it. Each run
    trains ``steps`` steps if given, else until its RL time reaches ``budget_s`` (at most ``max_steps``)."""
    if (steps is None) == (budget_s is None):
        raise ValueError("run_grid: give exactly one of steps and budget_s")
    import ray

    from benchmarks.ray_session import start_local_ray

    records: list[dict] = []
    test_problems = _load_test_problems(extra)
    started_ray = False
    try:
        for index, seed in enumerate(seeds):
            shift = index % len(ARMS)
            for arm in ARMS[shift:] + ARMS[:shift]:
                overrides = [*extra, *arm.config_overrides(), f"training.seed={seed}"]
                length = {"steps": steps} if steps is not None else {"budget_s": budget_s, "max_steps": max_steps}
                key = {"preset": PRESET, **length, "arm": arm.name, "overrides": overrides}
                record = journal.get(key) if journal else None
                if record is None:
                    if not started_ray:
                        start_local_ray()
                        started_ray = True
                    run = run_loop(PRESET, overrides, steps) if steps is not None else \
                        run_loop_for_seconds(PRESET, overrides, budget_s, max_steps)
                    record = _record(arm.name, seed, run, test_problems)
                    if journal:
                        journal.add(key, record)
                records.append(record)
                logger.info("%s seed %d: %.3f after %d steps (%.0f s of RL)", arm.name, seed, record["accuracy"],
                            record["steps"], record["rl_seconds"])
    finally:
        if started_ray:
            ray.shutdown()
    return records


def sampled_answers(run: LoopRun, problems: list, shown: int = SHOWN_ANSWERS) -> list[dict]:
    """The first ``shown`` held-out problems with the base's and the trained policy's greedy answers and the reward
    the run's verifier gave each, so a reader sees what an accuracy is made of (the same problems in every run)."""
    rows = []
    for index, problem in enumerate(problems[:shown]):
        row = {"problem": problem.id, "question": problem.prompt, "reference": problem.answer}
        for when, evaluation in (("base", run.base_evaluation), ("trained", run.final_evaluation)):
            known = evaluation is not None and TEST_SET in evaluation.answers
            row[when] = evaluation.answers[TEST_SET][index] if known else None
            row[f"{when}_reward"] = evaluation.rewards[TEST_SET][index] if known else None
        rows.append(row)
    return rows


def _record(arm: str, seed: int, run: LoopRun, problems: list) -> dict:
    steps = run.history
    return {"samples": sampled_answers(run, problems), "arm": arm, "seed": seed, "steps": len(steps),
            "rl_seconds": run.rl_seconds, "host": cpu_kind(),
            "wall_seconds": run.wall_seconds, "budget_reached": run.budget_reached,
            "median_step_seconds": run.median("time/step"),
            "accuracy": run.final_metrics[TEST_METRIC], "response_length": run.final_metrics.get(LENGTH_METRIC),
            "base_accuracy": run.initial_metrics.get(TEST_METRIC),
            "base_response_length": run.initial_metrics.get(LENGTH_METRIC),
            "train_reward": [step.get("reward/mean") for step in steps],
            "first_step": {key: steps[0].get(key) for key in FIRST_STEP_KEYS} if steps else {}}


def binomial_half_width(p: float, n: int) -> float:
    """The normal 95 % half-width of an accuracy ``p`` over ``n`` problems (one run's evaluation)."""
    return 1.96 * math.sqrt(max(p * (1 - p), 0.0) / n)


def table(records: list[dict], problems: int, settings: dict) -> dict:
    """Accuracy per arm (mean over seeds, t interval; per seed with its binomial interval), steps reached,
    paired differences, the base, and the seed check."""
    by_arm: dict[str, dict[int, dict]] = defaultdict(dict)
    for record in records:
        by_arm[record["arm"]][record["seed"]] = record
    accuracy = {arm: {seed: r["accuracy"] for seed, r in runs.items()} for arm, runs in by_arm.items()}
    figures: list[Figure] = []
    bases = sorted({r["base_accuracy"] for r in records if r["base_accuracy"] is not None})
    figures.append(Figure(f"base model held-out greedy accuracy ({problems} problems)",
                          bases[0] if len(bases) == 1 else None, "",
                          (f"± {binomial_half_width(bases[0], problems):.3f} (binomial 95 %); the same in all "
                           f"{len(records)} runs") if len(bases) == 1 else f"differs between runs: {bases}"))
    for arm in [a.name for a in ARMS if a.name in by_arm]:
        runs = by_arm[arm]
        estimate = t_interval(list(accuracy[arm].values()))
        interval = ("1 seed, no interval over seeds" if estimate.low is None else
                    f"95 % t interval over {estimate.n} seeds [{estimate.low:.3f}, {estimate.high:.3f}]")
        per_seed = "; ".join(
            f"seed {seed}: {r['accuracy']:.3f} ± {binomial_half_width(r['accuracy'], problems):.3f} after "
            f"{r['steps']} steps ({r['rl_seconds']:.0f} s of RL, {r['median_step_seconds']:.0f} s/step)"
            for seed, r in sorted(runs.items()))
        figures.append(Figure(f"{arm}: held-out greedy accuracy after training", estimate.mean, "",
                              f"{interval}; {per_seed}"))
    for pair in paired_comparisons(accuracy, COMPARISONS):
        difference = pair.difference
        interval = ("1 seed, no interval" if difference.low is None else
                    f"95 % t interval [{difference.low:.3f}, {difference.high:.3f}], n = {difference.n}")
        figures.append(Figure(f"{pair.a} − {pair.b}: accuracy, paired by seed", difference.mean, "",
                              f"{interval}; per seed "
                              + ", ".join(f"{s}: {value:+.3f}" for s, value in pair.per_seed.items())))
    figures += seed_check_figures(records)
    return BenchmarkResult(
        title=f"held-out accuracy after the same RL training per arm, SmolLM2-135M-Instruct ({PRESET})",
        settings=settings, figures=figures, measurements={"runs": records}).as_dict()


def _load_test_problems(extra: tuple[str, ...]) -> list:
    from orchestrator.config_loader import load_experiment
    from orchestrator.data import load_dataset

    return load_dataset(load_experiment(PRESET, list(extra)).data.eval[TEST_SET])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)),
                        help="comma-separated (default: %(default)s)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--budget-s", type=float, default=None,
                        help=f"RL seconds per run, Σ time/step (default: {DEFAULT_BUDGET_S:g}; a quiet machine only)")
    length.add_argument("--steps", type=int, default=None, help="RL steps per run instead of a time budget")
    parser.add_argument("--max-steps", type=int, default=None, help="step cap per run (default: the preset's steps)")
    parser.add_argument("--journal", type=Path, default=None, help="JSON-lines file of finished runs, reused")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report folder (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true", help="seed 0, one step per arm, the smallest batch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    require_loop()
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error("--budget-s: must be > 0")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps: must be >= 1")
    if args.steps is None and args.budget_s is None:
        args.budget_s = DEFAULT_BUDGET_S

    from orchestrator.config_loader import load_experiment

    extra = SMOKE_OVERRIDES if args.smoke else ()
    if args.smoke:
        seeds, args.budget_s, args.steps, args.max_steps = [0], 1e-6, None, 2  # the budget is spent by step 1
    max_steps = args.max_steps or load_experiment(PRESET, []).training.steps
    started = datetime.now(UTC)
    journal = RunJournal(args.journal) if args.journal else None
    records = run_grid(seeds, journal, budget_s=args.budget_s, max_steps=max_steps, steps=args.steps, extra=extra)
    length = {"rl_steps": args.steps} if args.steps else {"rl_budget_seconds": args.budget_s, "max_steps": max_steps}
    settings = {"preset": PRESET, "seeds": seeds, **length,
                "overrides": list(extra), "smoke": args.smoke,
                "arms": {arm.name: arm.config_overrides() for arm in ARMS},
                "rl_step": rl_step_shape(PRESET, list(extra)),
                "metric": f"{TEST_METRIC} (greedy, held-out problems)",
                "interval": "Student-t 95 % over seeds (sweeps.statistics); per run, binomial 95 % over problems"}
    report = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "smoke": args.smoke, "machine": machine_info(),
              "versions": versions(),
              "benchmarks": {"real_model": {"status": "ok", "result": table(records, len(_load_test_problems(extra)), settings),
                                            "wall_seconds": (datetime.now(UTC) - started).total_seconds()}}}
    stem = started.strftime("%Y%m%d-%H%M%S") + "-real-model" + ("-smoke" if args.smoke else "")
    json_path, md_path = write_report(report, args.out, stem)
    print(f"report: {json_path}\n        {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
