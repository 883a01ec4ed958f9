"""Learning efficiency on the toy task: accuracy after a fixed number of RL steps for none / ETS / GMTS.

cpu-tiny-s (2-digit addition, the tiny Qwen2 after its cached supervised warm-up), ρ = 0.2 top for
ETS and GMTS, ≥ 3 seeds (``training.seed``: the prompt order and the selection/sampling seeds; the
warm-up, and so the starting policy, is the same for every run). The figure per method is the final
greedy accuracy on the held-out split, mean ± sample std over seeds, with the mean wall-clock seconds
of a run beside it (the honest CPU analogue of the paper's headline: a fixed budget of steps, and
what that budget costs in time). Runs are interleaved seed by seed, methods rotated.

The full version takes hours on 2 cores; ``--smoke`` runs one seed for one step per method.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from benchmarks.ray_session import start_local_ray
from benchmarks.report import BenchmarkResult, Figure
from benchmarks.training_runs import require_loop, run_loop

METHODS = ("none", "ets", "gmts")
PRESET = "cpu-tiny-s"
METRIC = "eval/arithmetic/accuracy"


def settings_for(smoke: bool) -> dict:
    if smoke:
        return {"seeds": [0], "steps": 1, "methods": ("none", "gmts"),
                "overrides": ["warmup.enabled=false", "data.prompts_per_step=8", "learner.mini_batch_size=64",
                              "learner.micro_batch_size=64", "data.eval.arithmetic.limit=8"]}
    # The preset's own run length and eval set (300 held-out problems, greedy).
    return {"seeds": [0, 1, 2], "steps": None, "methods": METHODS, "overrides": []}


def run(smoke: bool) -> dict:
    require_loop()
    import ray

    from orchestrator.config_loader import load_experiment

    cfg = settings_for(smoke)
    methods = cfg["methods"]
    steps = cfg["steps"] or load_experiment(PRESET).training.steps
    accuracy: dict[str, list[float]] = defaultdict(list)
    wall: dict[str, list[float]] = defaultdict(list)
    per_run: list[dict] = []
    start_local_ray()
    try:
        for index, seed in enumerate(cfg["seeds"]):
            shift = index % len(methods)
            for method in methods[shift:] + methods[:shift]:
                overrides = cfg["overrides"] + [f"selection.method={method}", f"training.seed={seed}"]
                overrides += ["selection.ratio=null"] if method == "none" else ["selection.ratio=0.2", "selection.mode=top"]
                result = run_loop(PRESET, overrides, steps)
                accuracy[method].append(result.final_metrics[METRIC])
                wall[method].append(result.wall_seconds)
                per_run.append({"method": method, "seed": seed, "accuracy": result.final_metrics[METRIC],
                                "wall_seconds": result.wall_seconds, "median_step_s": result.median("time/step")})
    finally:
        ray.shutdown()

    figures: list[Figure] = []
    for method in methods:
        values = accuracy[method]
        std = statistics.stdev(values) if len(values) > 1 else None
        figures.append(Figure(f"{method}: final accuracy (mean over {len(values)} seeds)", statistics.fmean(values), "",
                              f"± {std:.3f} (sample std); seeds {values}; mean run {statistics.fmean(wall[method]):.0f} s"
                              if std is not None else f"one seed; run {wall[method][0]:.0f} s"))
    base = statistics.fmean(accuracy["none"])
    for method in methods[1:]:
        figures.append(Figure(f"{method} − none: accuracy", statistics.fmean(accuracy[method]) - base, "",
                              "difference of means (fraction of problems)"))
    return BenchmarkResult(
        title="accuracy after a fixed number of RL steps: none vs ETS vs GMTS top-20 % (cpu-tiny-s)",
        settings={"preset": PRESET, "steps": steps, "seeds": cfg["seeds"], "methods": list(methods),
                  "ratio": 0.2, "overrides": cfg["overrides"], "metric": METRIC},
        figures=figures, measurements={"runs": per_run},
    ).as_dict()
