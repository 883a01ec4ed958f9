"""Side-by-side timing on a shared, noisy CPU.

Other processes come and go on this machine, so an absolute number means little; what a benchmark
reports is a *ratio* of cases measured in the same run, interleaved round by round (A, B, C, A, B,
C, …, with the starting case rotated every round so that no case always runs right after another),
summarised by medians. Each round's cases share the machine's load of that moment, which is why
:func:`paired_ratio` (the median over rounds of A_i / B_i) is usually the steadiest figure.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass
class Samples:
    """Seconds per repetition of every case, in round order."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = 0
    warmup: int = 0

    def median(self, case: str) -> float:
        return statistics.median(self.seconds[case])

    def summary(self) -> dict[str, dict[str, float]]:
        return {case: _describe(values) for case, values in self.seconds.items()}


def interleaved(cases: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 1,
                before_each: Callable[[], object] | None = None, first_round: int = 0) -> Samples:
    """Run every case once per round, ``rounds`` times, after ``warmup`` untimed rounds.

    Round r starts with case number (first_round + r) mod len(cases): a caller that times one round per
    call passes its own round counter as ``first_round``, so that the rotation still happens.
    ``before_each`` (untimed) runs before every call, e.g. to reset state a case changes.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be ≥ 1, got {rounds}")
    names = list(cases)
    samples = Samples(seconds={name: [] for name in names}, rounds=rounds, warmup=warmup)
    for round_index in range(warmup + rounds):
        shift = (first_round + round_index) % len(names)
        for name in names[shift:] + names[:shift]:
            if before_each is not None:
                before_each()
            gc.collect()
            started = time.perf_counter()
            cases[name]()
            elapsed = time.perf_counter() - started
            if round_index >= warmup:
                samples.seconds[name].append(elapsed)
    return samples


def ratio_of_medians(samples: Samples, numerator: str, denominator: str) -> float:
    return samples.median(numerator) / samples.median(denominator)


def paired_ratio(samples: Samples, numerator: str, denominator: str) -> float:
    """Median over rounds of numerator_i / denominator_i (both measured in round i)."""
    pairs = zip(samples.seconds[numerator], samples.seconds[denominator], strict=True)
    return statistics.median(a / b for a, b in pairs)


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def _describe(values: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values), "n": len(values)}
