"""Learning efficiency on the toy task: accuracy after a fixed wall-clock RL budget for none / ETS / GMTS.

cpu-tiny-s (2-digit addition, the tiny Qwen2 after its cached supervised warm-up: every run starts
from the same base policy), ρ = 0.2 top for ETS and GMTS, ≥ 3 seeds. Each run trains until its RL
steps' own time (Σ ``time/step``: rollout, reward, learner update, weight sync, the loop's overhead)
reaches the budget, then evaluates greedily on the held-out split
(``training_runs.run_loop_for_seconds``). The figure per method is that final accuracy, mean ±
sample std over seeds, with the steps the budget bought — the honest CPU analogue of the paper's
headline: the same time, which method learns more. Runs are interleaved seed by seed, methods rotated.

The seed is ``training.seed`` (the prompt order, ``PromptSampler``, and the rollout sampling seeds,
``seed · 1_000_003 + group id``) and ``learner.seed`` (the mini-batch shuffle). The report checks it:
the first step's rollouts come before any update, so runs of one seed must score them identically
whatever the method, and runs of different seeds must not.

``--smoke`` runs one seed with a zero budget (one step, then the stop-and-resume path) per method.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from benchmarks.ray_session import start_local_ray
from benchmarks.report import BenchmarkResult, Figure
from benchmarks.training_runs import LoopRun, require_loop, rl_step_shape, run_loop_for_seconds

# ETS and GMTS in the GMTS release's published settings (workers/learner/recipes.py), as the specs run them.
METHODS = ("none", "ets-release", "gmts-release")
PRESET = "cpu-tiny-s"
METRIC = "eval/arithmetic/accuracy"
# What the first step's rollouts scored: equal within a seed (no update yet), different across seeds.
FIRST_STEP_KEYS = ("train/accuracy", "reward/mean", "train/response_length")


def settings_for(smoke: bool) -> dict:
    if smoke:
        return {"seeds": [0], "budget_seconds": 0.0, "max_steps": 2, "methods": ("none", "gmts-release"),
                "overrides": ["warmup.enabled=false", "data.prompts_per_step=8", "learner.mini_batch_size=64",
                              "learner.micro_batch_size=64", "data.eval.arithmetic.limit=8"]}
    # The preset's RL step (128 prompts × 8, 4 optimiser steps) and eval set (300 held-out problems,
    # greedy). ≈ 1.4 s per step on an idle machine: 150 s buys ≈ 100 steps; max_steps is only a cap.
    return {"seeds": [0, 1, 2], "budget_seconds": 150.0, "max_steps": 1000, "methods": METHODS, "overrides": []}


def run(smoke: bool) -> dict:
    require_loop()
    import ray

    cfg = settings_for(smoke)
    methods = cfg["methods"]
    runs: dict[str, list[LoopRun]] = defaultdict(list)
    per_run: list[dict] = []
    start_local_ray()
    try:
        for index, seed in enumerate(cfg["seeds"]):
            shift = index % len(methods)
            for method in methods[shift:] + methods[:shift]:
                chosen = ["selection.recipe=null", "selection.method=none"] if method == "none" else [
                    f"selection.recipe={method}"]
                overrides = cfg["overrides"] + chosen + [f"training.seed={seed}",
                                                f"learner.seed={seed}"]
                overrides += ["selection.ratio=null"] if method == "none" else ["selection.ratio=0.2", "selection.mode=top"]
                result = run_loop_for_seconds(PRESET, overrides, cfg["budget_seconds"], cfg["max_steps"])
                runs[method].append(result)
                per_run.append({
                    "method": method, "seed": seed, "accuracy": result.final_metrics[METRIC],
                    "initial_accuracy": result.initial_metrics.get(METRIC), "steps": len(result.history),
                    "rl_seconds": result.rl_seconds, "budget_reached": result.budget_reached,
                    "wall_seconds": result.wall_seconds, "median_step_s": result.median("time/step"),
                    "first_step": {k: result.history[0].get(k) for k in FIRST_STEP_KEYS},
                    "train_accuracy_last_step": result.history[-1].get("train/accuracy"),
                })
    finally:
        ray.shutdown()

    figures: list[Figure] = []
    accuracy = {m: [r.final_metrics[METRIC] for r in runs[m]] for m in methods}
    for method in methods:
        values, done = accuracy[method], runs[method]
        steps = [len(r.history) for r in done]
        spread = f"± {statistics.stdev(values):.3f} (sample std)" if len(values) > 1 else "one seed"
        figures.append(Figure(
            f"{method}: accuracy after the budget (mean over {len(values)} seeds)", statistics.fmean(values), "",
            f"{spread}; seeds {[round(v, 3) for v in values]}; steps {steps}; "
            f"RL {statistics.fmean(r.rl_seconds for r in done):.0f} s, whole run {statistics.fmean(r.wall_seconds for r in done):.0f} s"))
    base = statistics.fmean(accuracy["none"])
    for method in methods[1:]:
        paired = [a - b for a, b in zip(accuracy[method], accuracy["none"], strict=True)]
        figures.append(Figure(f"{method} − none: accuracy", statistics.fmean(accuracy[method]) - base, "",
                              f"difference of means (fraction of problems); per seed {[round(d, 3) for d in paired]}"))
    initial = {r["initial_accuracy"] for r in per_run}
    figures.append(Figure("base policy accuracy (step-0 evaluation of every run)",
                          next(iter(initial)) if len(initial) == 1 else None, "",
                          "the same in every run" if len(initial) == 1 else f"differs between runs: {sorted(initial)}"))
    for method in methods[1:]:
        figures.append(Figure(f"{method} ÷ none: RL steps the budget bought",
                              statistics.fmean(len(r.history) for r in runs[method])
                              / statistics.fmean(len(r.history) for r in runs["none"]), "×",
                              "mean steps; the step time differs by the selection cost and by the answers' lengths"))
    figures += _seed_check(per_run)
    return BenchmarkResult(
        title="accuracy after a fixed wall-clock RL budget: none vs ETS vs GMTS top-20 % (cpu-tiny-s)",
        settings={"preset": PRESET, "budget_seconds_of_rl": cfg["budget_seconds"], "max_steps": cfg["max_steps"],
                  "seeds": cfg["seeds"], "methods": list(methods), "ratio": 0.2, "overrides": cfg["overrides"],
                  "rl_step": rl_step_shape(PRESET, cfg["overrides"]),
                  "metric": METRIC + " (greedy, held-out)",
                  "budget": "Σ time/step (rollout + reward + learner + sync + loop overhead); actor start-up, "
                            "evaluations and checkpoint writes are outside it"},
        figures=figures, measurements={"runs": per_run},
    ).as_dict()


def _seed_check(per_run: list[dict]) -> list[Figure]:
    """The first step's rollouts: one signature per seed (all methods alike), a different one for every seed."""
    by_seed: dict[int, set] = defaultdict(set)
    for entry in per_run:
        by_seed[entry["seed"]].add(tuple(entry["first_step"][k] for k in FIRST_STEP_KEYS))
    same_within = all(len(signatures) == 1 for signatures in by_seed.values())
    firsts = [next(iter(signatures)) for signatures in by_seed.values()]
    distinct_across = len(set(firsts)) == len(firsts)
    detail = "; ".join(f"seed {seed}: " + ", ".join(f"{k}={v:.4g}" for k, v in zip(FIRST_STEP_KEYS, sig))
                       for seed, signatures in sorted(by_seed.items()) for sig in sorted(signatures))
    return [Figure("seed check: first-step rollouts identical across methods within each seed", str(same_within), "",
                   detail),
            Figure("seed check: first-step rollouts differ between seeds", str(distinct_across) if len(firsts) > 1
                   else "n/a (one seed)", "", f"{len(firsts)} seeds")]
