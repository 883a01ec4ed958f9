"""The ablation table: final metrics aggregated over seeds, with GMTS's Δ over ETS.

One *cell* per (model_size, algorithm, method, scope, denominator, mode, ratio, lr, benchmark, metric):
the mean, the sample standard deviation (ddof = 1) and the 95 % t interval over the seeds that finished
(:mod:`sweeps.statistics`; none with a single seed). ``method`` is a reference recipe's name when the
trial ran one (ets-release, gmts-release, …). Each arm's lr is chosen on the validation benchmarks
(``selected``; never on a test one), and for the GMTS methods Δ = GMTS − ETS, each at its own chosen lr,
is paired by seed at the same model size, algorithm, mode, ratio and benchmark, with its own interval.
Who is compared with whom is the registry's (``compared_with``: gmts-release and gmts-paper with ets-release); a
plain method with its plain partner at the same scope and denominator (a matched-scope pair: "which score",
not "which population"). ``base`` cells hold the base policy's step-0 evaluation, the row every arm
starts from. Values stay in the metric's own units (fractions).
These cells are what ``GET /v1/sweeps/{id}/results`` serves; the Markdown/HTML/terminal views
(:mod:`sweeps.table_views`) are built from them.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel

from sweeps.results import BASE_METRIC, EVAL_METRIC, SweepRuns, TrialPoint
from sweeps.statistics import paired_difference, t_interval
from workers.learner.methods import comparison_partner
from workers.learner.methods import method_rank as registry_rank
from workers.learner.recipes import RECIPES

BASE = "base"  # the method name of the base-policy row
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
    values: list[float] = []  # one per seed, in the order of ``seeds``
    ci_low: float | None = None  # 95 % t interval over seeds; None with one seed
    ci_high: float | None = None
    lr: float | None = None
    split: str = "test"  # "validation" benchmarks choose lrs; only "test" ones are the result
    selected: bool = True  # this arm's lr, chosen on validation (always true with one lr per arm)
    delta_vs_ets: float | None = None  # methods with a partner only: mean over seeds of (it − partner), by seed
    delta_ci_low: float | None = None
    delta_ci_high: float | None = None
    delta_n: int | None = None  # seeds in the pairing


class TrialSummary(BaseModel):
    name: str
    run_id: str
    status: str
    point: TrialPoint


class AblationResults(BaseModel):
    sweep_id: str
    parent_run_id: str
    spec_name: str
    lr_source: str = ""  # where the spec's fixed lrs come from ("" = nothing said)
    benchmarks: list[str]
    metrics: list[str]
    model_sizes: list[str]
    algorithms: list[str]
    finished: int
    unfinished: list[TrialSummary]
    cells: list[Cell]


def ablation(runs: SweepRuns) -> AblationResults:
    groups: dict[tuple, list[tuple[int | None, float]]] = defaultdict(list)
    validation: set[str] = set()
    bases: dict[tuple, set[tuple[str | None, float]]] = defaultdict(set)
    for trial in runs.trials:
        p = trial.point
        validation.update(trial.validation)
        for key, value in trial.final.items():
            match = EVAL_METRIC.match(key)
            assert match is not None  # TrialRecord.final holds eval metrics only
            point = (p.model_size, p.algorithm, p.method, p.scope, p.denominator, p.mode, p.ratio, p.lr,
                     match["benchmark"], match["metric"])
            groups[point].append((p.seed, value))
        for key, value in trial.base.items():
            match = BASE_METRIC.match(key)
            assert match is not None
            # Every trial of a sweep starts from the same base: one measurement per distinct base, not per trial.
            bases[(p.model_size, p.algorithm, match["benchmark"], match["metric"])].add((trial.base_checksum, value))
    cells = [_cell(point, values, validation) for point, values in groups.items()]
    cells += [_cell((size, algorithm, BASE, None, None, None, None, None, benchmark, metric), [(None, v) for _, v in sorted(found)],
                    validation) for (size, algorithm, benchmark, metric), found in bases.items()]
    _select_lrs(cells)
    _add_deltas(cells)
    cells.sort(key=_cell_order)
    return AblationResults(
        sweep_id=runs.sweep_id,
        parent_run_id=runs.parent_run_id,
        spec_name=runs.spec_name,
        lr_source=runs.lr_source,
        benchmarks=sorted({c.benchmark for c in cells}),
        metrics=sorted({c.metric for c in cells}),
        model_sizes=sorted({c.model_size for c in cells}),
        algorithms=sorted({c.algorithm for c in cells}),
        finished=len(runs.trials),
        unfinished=[TrialSummary(name=t.name, run_id=t.run_id, status=t.status, point=t.point) for t in runs.unfinished],
        cells=cells,
    )


def _cell(point: tuple, values: list[tuple[int | None, float]], validation: set[str]) -> Cell:
    model_size, algorithm, method, scope, denominator, mode, ratio, lr, benchmark, metric = point
    ordered = sorted(values, key=lambda sv: (sv[0] is None, sv[0] or 0))
    estimate = t_interval([v for _, v in ordered])
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
        mean=estimate.mean,
        std=estimate.std,
        n=estimate.n,
        seeds=[s for s, _ in ordered],
        values=[v for _, v in ordered],
        ci_low=estimate.low,
        ci_high=estimate.high,
        lr=lr,
        split="validation" if benchmark in validation else "test",
    )


def _arm_key(cell: Cell) -> tuple:
    return (cell.model_size, cell.algorithm, cell.method, cell.scope, cell.denominator, cell.mode, cell.ratio,
            cell.metric)


def _select_lrs(cells: list[Cell]) -> None:
    """Per arm and metric, keep the lr with the best mean over the validation benchmarks; with no
    validation benchmark an arm with several lrs gets none selected (choosing on test would be selection
    on the numbers reported), and the views show every lr."""
    by_arm: dict[tuple, list[Cell]] = defaultdict(list)
    for cell in cells:
        by_arm[_arm_key(cell)].append(cell)
    for arm_cells in by_arm.values():
        lrs = {c.lr for c in arm_cells}
        if len(lrs) <= 1:
            continue
        scores: dict[float | None, list[float]] = defaultdict(list)
        for cell in arm_cells:
            if cell.split == "validation":
                scores[cell.lr].append(cell.mean)
        best = max(scores, key=lambda lr: (sum(scores[lr]) / len(scores[lr]), -(lr or 0.0))) if scores else None
        for cell in arm_cells:
            cell.selected = best is not None and cell.lr == best


def _add_deltas(cells: list[Cell]) -> None:
    selected = {_comparison_key(c, c.method): c for c in cells if c.selected}
    for cell in cells:
        partner = comparison_partner(cell.method)
        if partner is None or not cell.selected:
            continue
        reference = selected.get(_comparison_key(cell, partner))
        if reference is None:
            continue
        difference = paired_difference(dict(zip(cell.seeds, cell.values, strict=True)),
                                       dict(zip(reference.seeds, reference.values, strict=True)))
        if difference is None:
            continue
        cell.delta_vs_ets, cell.delta_n = difference.mean, difference.n
        cell.delta_ci_low, cell.delta_ci_high = difference.low, difference.high


def _comparison_key(cell: Cell, method: str) -> tuple:
    # Recipes fix their own populations; plain methods are compared at the same scope and denominator.
    population = () if method in RECIPES else (cell.scope, cell.denominator)
    return (method, *population, cell.model_size, cell.algorithm, cell.mode, cell.ratio, cell.benchmark,
            cell.metric)


def method_rank(method: str) -> tuple[int, str]:
    """Row order: the base policy's row first, then the registry's order (workers.learner.methods.method_rank)."""
    return (-1 if method == BASE else registry_rank(method), method)


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
        -1.0 if cell.lr is None else cell.lr,
        cell.benchmark,
        cell.metric,
    )
