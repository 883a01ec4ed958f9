"""The ablation table: final metrics aggregated over seeds, with GMTS's Δ over ETS.

One *cell* per (model_size, algorithm, method, scope, denominator, mode, ratio, benchmark, metric):
the mean and the sample standard deviation (ddof = 1; None with a single seed) over the seeds that
finished, and, for the GMTS methods, Δ = mean(GMTS) − mean(ETS) at the same model size, algorithm,
mode, ratio and benchmark, as in the paper's tables. ``method`` is a reference recipe's name when the
trial ran one (ets-release, gmts-release, …). A GMTS recipe is compared with its partner recipe
(:data:`DELTA_PARTNERS`: the paper's own setting); a plain GMTS method with plain ETS at the same
scope and denominator (a matched-scope pair: "which score", not "which population"). Values stay in the metric's own units (fractions).
These cells are what ``GET /v1/sweeps/{id}/results`` serves; the Markdown/HTML/terminal views
(:mod:`sweeps.table_views`) are built from them.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from pydantic import BaseModel

from sweeps.results import EVAL_METRIC, SweepRuns, TrialPoint

METHOD_ORDER = ("none", "ets-8020", "ets-trl", "ets-release", "ets", "gmts-release", "gmts-paper", "gmts",
                "gmts_exact", "random")
GMTS_METHODS = ("gmts", "gmts_exact", "gmts-release", "gmts-paper")
# GMTS recipe → the ETS recipe it is compared with (Δ); plain GMTS methods compare with plain 'ets'.
DELTA_PARTNERS = {"gmts-release": "ets-release", "gmts-paper": "ets-release"}
MODE_ORDER = (None, "top", "bottom")


class Cell(BaseModel):
    model_size: str
    algorithm: str
    method: str
    scope: str | None = None
    denominator: str | None = None
    mode: str | None
    ratio: float | None
    benchmark: str
    metric: str  # "accuracy" (avg@k), "pass@k", …
    mean: float
    std: float | None  # sample std over seeds (ddof=1); None with one seed
    n: int
    seeds: list[int | None]
    delta_vs_ets: float | None = None  # GMTS methods only: mean − mean of ETS at the same point


class TrialSummary(BaseModel):
    name: str
    run_id: str
    status: str
    point: TrialPoint


class AblationResults(BaseModel):
    sweep_id: str
    parent_run_id: str
    spec_name: str
    benchmarks: list[str]
    metrics: list[str]
    model_sizes: list[str]
    algorithms: list[str]
    finished: int
    unfinished: list[TrialSummary]
    cells: list[Cell]


def ablation(runs: SweepRuns) -> AblationResults:
    groups: dict[tuple, list[tuple[int | None, float]]] = defaultdict(list)
    for trial in runs.trials:
        p = trial.point
        for key, value in trial.final.items():
            match = EVAL_METRIC.match(key)
            assert match is not None  # TrialRecord.final holds eval metrics only
            point = (p.model_size, p.algorithm, p.method, p.scope, p.denominator, p.mode, p.ratio,
                     match["benchmark"], match["metric"])
            groups[point].append((p.seed, value))
    cells = [_cell(point, values) for point, values in groups.items()]
    _add_deltas(cells)
    cells.sort(key=_cell_order)
    return AblationResults(
        sweep_id=runs.sweep_id,
        parent_run_id=runs.parent_run_id,
        spec_name=runs.spec_name,
        benchmarks=sorted({c.benchmark for c in cells}),
        metrics=sorted({c.metric for c in cells}),
        model_sizes=sorted({c.model_size for c in cells}),
        algorithms=sorted({c.algorithm for c in cells}),
        finished=len(runs.trials),
        unfinished=[TrialSummary(name=t.name, run_id=t.run_id, status=t.status, point=t.point) for t in runs.unfinished],
        cells=cells,
    )


def _cell(point: tuple, values: list[tuple[int | None, float]]) -> Cell:
    model_size, algorithm, method, scope, denominator, mode, ratio, benchmark, metric = point
    numbers = [v for _, v in values]
    return Cell(
        model_size=model_size,
        algorithm=algorithm,
        method=method,
        scope=scope,
        denominator=denominator,
        mode=mode,
        ratio=ratio,
        benchmark=benchmark,
        metric=metric,
        mean=statistics.fmean(numbers),
        std=statistics.stdev(numbers) if len(numbers) > 1 else None,
        n=len(numbers),
        seeds=sorted((s for s, _ in values), key=lambda s: (s is None, s)),
    )


def _add_deltas(cells: list[Cell]) -> None:
    ets = {_comparison_key(c, c.method): c.mean for c in cells if c.method.startswith("ets")}
    for cell in cells:
        if cell.method in GMTS_METHODS:
            key = _comparison_key(cell, DELTA_PARTNERS.get(cell.method, "ets"))
            if key in ets:
                cell.delta_vs_ets = cell.mean - ets[key]


def _comparison_key(cell: Cell, ets_method: str) -> tuple:
    # Recipes fix their own populations; plain methods are compared at the same scope and denominator.
    population = () if ets_method != "ets" else (cell.scope, cell.denominator)
    return (ets_method, *population, cell.model_size, cell.algorithm, cell.mode, cell.ratio, cell.benchmark,
            cell.metric)


def method_rank(method: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def mode_rank(mode: str | None) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


def _cell_order(cell: Cell) -> tuple:
    return (
        cell.model_size,
        cell.algorithm,
        method_rank(cell.method),
        cell.scope or "",
        cell.denominator or "",
        mode_rank(cell.mode),
        -1.0 if cell.ratio is None else cell.ratio,
        cell.benchmark,
        cell.metric,
    )
