"""How sure a table is: Student-t 95 % intervals over seeds, and paired differences between two arms.

Seeds are the unit of replication: each finished seed gives one number per cell, and the interval is
``mean ± t(0.975, n − 1) · s / √n`` with the sample standard deviation ``s`` (ddof = 1). A difference
between two arms pairs their runs by seed (both arms start from the same base and, with the same seed,
draw the same prompts), which removes the seed-to-seed variation the two share.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    mean: float
    n: int
    std: float | None  # sample standard deviation (ddof = 1); None with one value
    low: float | None  # the 95 % t interval; None with one value (no spread to estimate)
    high: float | None

    @property
    def half_width(self) -> float | None:
        return None if self.high is None else self.high - self.mean


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """The mean of ``values`` with its two-sided Student-t interval (none for a single value)."""
    if not values:
        raise ValueError("t_interval: no values")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Estimate(mean, 1, None, None, None)
    std = statistics.stdev(values)
    half = stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * std / math.sqrt(len(values))
    return Estimate(mean, len(values), std, mean - half, mean + half)


def paired_difference(a: Mapping[int | None, float], b: Mapping[int | None, float]) -> Estimate | None:
    """``a − b`` over the seeds both arms finished, with the t interval of the per-seed differences."""
    seeds = sorted((set(a) & set(b)) - {None})
    if not seeds:
        return None
    return t_interval([a[seed] - b[seed] for seed in seeds])


@dataclass(frozen=True)
class PairedComparison:
    a: str
    b: str
    difference: Estimate  # a − b, over the seeds both arms finished
    per_seed: dict[int, float]  # seed → a − b


def paired_comparisons(by_arm: Mapping[str, Mapping[int, float]],
                       pairs: Sequence[tuple[str, str]]) -> list[PairedComparison]:
    """``a − b`` paired by seed for each (a, b) of ``pairs`` whose arms both ran and share a seed, in order."""
    out = []
    for a, b in pairs:
        if a in by_arm and b in by_arm:
            difference = paired_difference(by_arm[a], by_arm[b])
            if difference is not None:
                seeds = sorted((set(by_arm[a]) & set(by_arm[b])) - {None})
                out.append(PairedComparison(a, b, difference, {s: by_arm[a][s] - by_arm[b][s] for s in seeds}))
    return out
