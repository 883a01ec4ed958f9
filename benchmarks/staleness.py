"""What rolling out ahead of the learner does to a run: the step's time, and how far off-policy it trains.

Runs the cpu-tiny-s preset (GRPO, GMTS-release top-20 %, 128 prompts × 8, 4 optimiser steps per RL step) with
``rollout.max_staleness`` k = 0, 1 and 2, the same seed and steps, every arm with π_old from the engine's sampling
logprobs (``learner.old_logp_source=rollout``, which k > 0 needs; so k = 0 differs from k > 0 in the lag alone),
alternating the arms round by round. Per arm, over the steps whose batch has its full lag (step > k):

- time: median ``time/step`` and the ratio k = 0 ÷ k (> 1: the overlap saves time), median
  ``time/rollout_wait`` (rollout time the step did not hide), and each side's busy share of the step
  (rollout ``time/rollout``, learner ``time/train_step_s``, each ÷ the step);
- science: mean |r − 1| (``policy/ratio_abs_dev``), the clipped share (``loss/clip_fraction_high`` + ``_low``),
  and how GMTS's H·|ω| ranks a group's tokens against H·|A| (``selection/gmts_vs_h_abs_a_spearman`` and
  ``_overlap``): 1 where they select alike.

The first mini-batch of an on-policy step has r = 1; the later three are off-policy by the updates before them,
so k = 0 is not all ones either: the lag adds to that.
"""

from __future__ import annotations

import statistics

from benchmarks.ray_session import start_local_ray
from benchmarks.report import BenchmarkResult, Figure
from benchmarks.training_runs import LoopRun, require_loop, run_loop

PRESET = "cpu-tiny-s"
COMMON = ("learner.old_logp_source=rollout",)
SCIENCE = {
    "mean |r − 1|": ("policy/ratio_abs_dev",),
    "clipped share": ("loss/clip_fraction_high", "loss/clip_fraction_low"),
    "Spearman(H·|ω|, H·|A|)": ("selection/gmts_vs_h_abs_a_spearman",),
    "top-ρ overlap of H·|ω| and H·|A|": ("selection/gmts_vs_h_abs_a_overlap",),
}


def run(smoke: bool) -> dict:
    require_loop()
    import ray

    lags = (0, 1) if smoke else (0, 1, 2)
    steps, rounds = (3, 1) if smoke else (20, 2)
    extra = ("warmup.enabled=false", "data.prompts_per_step=8", "learner.mini_batch_size=64",
             "learner.micro_batch_size=64", "data.eval.arithmetic.limit=8",
             "data.eval.arithmetic_val.limit=8") if smoke else ("data.eval.arithmetic.limit=64",
                                                                "data.eval.arithmetic_val.limit=64")
    runs: dict[int, list[LoopRun]] = {k: [] for k in lags}
    start_local_ray()
    try:
        for round_index in range(rounds):
            order = lags[round_index % len(lags):] + lags[:round_index % len(lags)]
            for k in order:
                runs[k].append(run_loop(PRESET, [*COMMON, *extra, f"rollout.max_staleness={k}"], steps))
    finally:
        ray.shutdown()

    def lagged(k: int) -> list[dict[str, float]]:
        """Steps whose batch carries the full lag k, past the first (one-time costs)."""
        return [m for run in runs[k] for m in run.history[1:] if m.get("rollout/staleness", 0.0) == k]

    def median(k: int, key: str) -> float:
        return statistics.median(m[key] for m in lagged(k) if key in m)

    def mean_sum(k: int, keys: tuple[str, ...]) -> float:
        rows = [sum(m[key] for key in keys) for m in lagged(k) if all(key in m for key in keys)]
        return statistics.fmean(rows) if rows else float("nan")

    figures = []
    for k in lags:
        step = median(k, "time/step")
        figures.append(Figure(f"k={k}: median s per RL step", step, "s",
                              f"rollout wait {median(k, 'time/rollout_wait'):.3f} s; {len(lagged(k))} steps"))
        if k:
            figures.append(Figure(f"k={k}: step-time ratio k=0 ÷ k={k}", median(0, "time/step") / step, "×"))
        figures.append(Figure(f"k={k}: rollout busy share", 100 * median(k, "time/rollout") / step, "%"))
        figures.append(Figure(f"k={k}: learner busy share", 100 * median(k, "time/train_step_s") / step, "%"))
        figures += [Figure(f"k={k}: {name}", mean_sum(k, keys), "") for name, keys in SCIENCE.items()]
    return BenchmarkResult(
        title="rollout.max_staleness on cpu-tiny-s: step time and how far off-policy the learner trains",
        settings={"preset": PRESET, "lags": list(lags), "steps_per_run": steps, "rounds": rounds,
                  "overrides": [*COMMON, *extra]},
        figures=figures,
        measurements={f"k={k}": [{key: v for key, v in m.items() if key.startswith(("time/", "policy/", "loss/clip",
                                                                                     "selection/gmts_vs", "rollout/"))}
                                 for m in lagged(k)] for k in lags},
        notes=["Science figures are means over the lagged steps of every round; times are medians.",
               "Busy shares of the two sides may add up to more than 100 % where they overlap (k > 0)."],
    ).as_dict()
