"""Selection at the training-run level: step time with method none vs ets vs gmts vs gmts_exact.

A few RL steps of ``train()`` on cpu-tiny-s per method (ρ = 0.2, the preset's scope), methods
interleaved run by run and the order rotated every round. Each run's first step is dropped (one-time
costs); figures are medians over the remaining steps of all rounds, as ratios to method ``none``:
the whole step (``time/step``), the learner's update (``time/train_step_s``), and the learner's
selection-and-loss phase as a share of its update.

The released GMTS code's way (an extra no-grad forward per mini-batch) is not a mode of our loop;
its step is estimated as our gmts step plus the learner's measured forward time (``time/forward_s``,
a forward *with* autograd, so the estimate is on the high side) — the exact side-by-side figure is
in ``selection_overhead``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from benchmarks.ray_session import start_local_ray
from benchmarks.report import BenchmarkResult, Figure
from benchmarks.training_runs import LoopRun, require_loop, rl_step_shape, run_loop

METHODS = ("none", "ets", "gmts", "gmts_exact")
PRESET = "cpu-tiny-s"
LEARNER_KEYS = ("time/train_step_s", "time/forward_s", "time/selection_and_loss_s", "time/backward_s")


def settings_for(smoke: bool) -> dict:
    # Plain methods at the preset's population (scope group): the preset's recipe is cleared.
    common = ["data.eval.arithmetic.limit=32", "data.eval.arithmetic_val.limit=32", "selection.recipe=null",
              "selection.scope=group", "selection.ratio=0.2"]
    if smoke:
        # Two runs, no discarded warm-up run: every train() pays its actors' start-up (tens of seconds on 2
        # cores), and the warm-up run is the measured runs' own code path, there only to steady the figures.
        return {"steps": 2, "rounds": 1, "methods": ("none", "gmts_exact"), "warmup_run": False,
                "overrides": common + ["warmup.enabled=false", "data.prompts_per_step=8", "learner.mini_batch_size=64",
                                       "learner.micro_batch_size=64", "data.eval.arithmetic.limit=8", "data.eval.arithmetic_val.limit=8"]}
    return {"steps": 8, "rounds": 3, "methods": METHODS, "warmup_run": True, "overrides": common}


def run(smoke: bool) -> dict:
    require_loop()
    import ray

    cfg = settings_for(smoke)
    methods = cfg["methods"]
    runs: dict[str, list[LoopRun]] = defaultdict(list)
    start_local_ray()
    try:
        if cfg["warmup_run"]:
            # A discarded run first: the first train() of a fresh Ray session also pays for Ray's worker
            # pool and cold file caches, which would otherwise land on whichever method runs first.
            run_loop(PRESET, cfg["overrides"] + ["selection.method=gmts"], 2)
        for round_index in range(cfg["rounds"]):
            shift = round_index % len(methods)
            for method in methods[shift:] + methods[:shift]:
                overrides = cfg["overrides"] + [f"selection.method={method}"]
                if method == "none":  # keeps every token: the preset's ratio must go
                    overrides = [o for o in overrides if not o.startswith("selection.ratio")] + ["selection.ratio=null"]
                runs[method].append(run_loop(PRESET, overrides, cfg["steps"]))
    finally:
        ray.shutdown()

    steps = {m: _pooled(runs[m], "time/step") for m in methods}
    learner = {m: _pooled(runs[m], "time/train_step_s") for m in methods}
    sel_loss = {m: _pooled(runs[m], "time/selection_and_loss_s") for m in methods}
    forward = {m: _pooled(runs[m], "time/forward_s") for m in methods}
    figures: list[Figure] = []
    for method in methods[1:]:
        figures.append(Figure(f"step time {method} / none (paired by round)", _paired(runs, method, "time/step"),
                              "×", f"pooled medians {_median(steps[method]):.3f} s vs {_median(steps['none']):.3f} s"))
    for method in methods[1:]:
        figures.append(Figure(f"learner update {method} / none (paired by round)",
                              _paired(runs, method, "time/train_step_s"), "×", "time/train_step_s"))
    for method in methods:
        share = _ratio(_median(sel_loss[method]), _median(learner[method]))
        figures.append(Figure(f"{method}: selection+loss share of the learner update",
                              None if share is None else 100 * share, "%",
                              "time/selection_and_loss_s ÷ time/train_step_s (same steps); gmts_exact's G is "
                              "computed in the forward phase"))
    for method in methods[1:]:
        figures.append(Figure(f"learner forward phase {method} / none (paired by round)",
                              _paired(runs, method, "time/forward_s"), "×", "time/forward_s (entropy, G inside)"))
    rollout = [run.median("time/rollout") for m in methods for run in runs[m]]
    rollout = [r for r in rollout if r is not None]
    if rollout:
        figures.append(Figure("run-to-run spread: slowest / fastest run's rollout phase", max(rollout) / min(rollout),
                              "×", "the rollout does not depend on the method: this is the noise floor of the "
                              "run-level ratios above"))
    gmts_step, gmts_forward = _median(steps.get("gmts", [])), _median(forward.get("gmts", []))
    if gmts_step and gmts_forward is not None:
        figures.append(Figure("released-way step (estimated) / our gmts step", (gmts_step + gmts_forward) / gmts_step,
                              "×", "our gmts step + one more forward (time/forward_s) per mini-batch"))
    return BenchmarkResult(
        title="step time by selection method in train() (cpu-tiny-s)",
        settings={"preset": PRESET, "methods": list(methods), "steps_per_run": cfg["steps"],
                  "rounds": cfg["rounds"], "discarded_warmup_run": cfg["warmup_run"],
                  "overrides": cfg["overrides"],
                  "rl_step": rl_step_shape(PRESET, cfg["overrides"] + ["selection.method=gmts"]),
                  "steady_steps_per_method": {m: len(steps[m]) for m in methods}},
        figures=figures,
        measurements={m: [run.breakdown() for run in runs[m]] for m in methods},
        notes=[(("one discarded warm-up run first; " if cfg["warmup_run"] else "") +
                "each run's first step is dropped; a run's figure is the "
                "median of its remaining steps; 'paired by round' = median over rounds of run(method) / run(none) "
                "of the same round.")],
    ).as_dict()


def _pooled(runs: list[LoopRun], key: str) -> list[float]:
    return [step[key] for run in runs for step in run.steady_steps() if key in step]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _paired(runs: dict[str, list[LoopRun]], method: str, key: str) -> float | None:
    """Median over rounds of (run of ``method``'s median ``key``) / (the same round's ``none`` run's)."""
    ratios = [_ratio(a.median(key), b.median(key)) for a, b in zip(runs[method], runs["none"], strict=True)]
    ratios = [r for r in ratios if r is not None]
    return statistics.median(ratios) if ratios else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b
