"""The sweep figures drawn from a synthetic AblationResults (no MLflow): what each one shows, and when none."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest

from sweeps import plots
from sweeps.ablation import AblationResults, Cell
from sweeps.statistics import t_interval


def _cell(method: str, mode: str | None, ratio: float | None, values: list[float], *, benchmark: str = "arithmetic",
          lr: float | None = None, selected: bool = True) -> Cell:
    estimate = t_interval(values)
    return Cell(model_size="tiny-s", algorithm="grpo", method=method, mode=mode, ratio=ratio, benchmark=benchmark,
                metric="accuracy", mean=estimate.mean, std=estimate.std, n=estimate.n, seeds=list(range(len(values))),
                values=values, ci_low=estimate.low, ci_high=estimate.high, lr=lr, selected=selected)


def _results(cells: list[Cell]) -> AblationResults:
    return AblationResults(sweep_id="synthetic", parent_run_id="p", spec_name="synthetic", benchmarks=["arithmetic"],
                           metrics=["accuracy"], model_sizes=["tiny-s"], algorithms=["grpo"], finished=len(cells),
                           unfinished=[], cells=cells)


BOTH_MODES = [
    _cell("base", None, None, [0.10]),
    _cell("none", None, None, [0.30, 0.34]),
    _cell("ets", "top", 0.5, [0.33, 0.35]),
    _cell("ets", "top", 0.2, [0.31, 0.37, 0.34]),
    _cell("ets", "bottom", 0.2, [0.12, 0.16]),
    _cell("ets", "bottom", 0.5, [0.20, 0.22]),
    _cell("ets", "bottom", 0.2, [0.90, 0.95], lr=1e-3, selected=False),  # not the lr validation chose
    _cell("gmts", "top", 0.2, [0.40, 0.42]),  # top only: no panel
]


def test_top_vs_bottom_panels_pair_each_method_run_in_both_modes() -> None:
    panels = plots.top_vs_bottom_panels(_results(BOTH_MODES))
    assert list(panels) == [("tiny-s", "grpo")]
    arms = panels[("tiny-s", "grpo")]
    assert list(arms) == [("arithmetic", "ets")]
    top, bottom = arms[("arithmetic", "ets")]["top"], arms[("arithmetic", "ets")]["bottom"]
    assert [c.ratio for c in top] == [0.2, 0.5] and [c.ratio for c in bottom] == [0.2, 0.5]
    assert bottom[0].mean == pytest.approx(0.14) and all(c.selected for c in bottom)
    # The interval drawn is the tables' t interval: 3 seeds, t(0.975, 2) = 4.303.
    assert plots._half_width(top[0]) == pytest.approx(4.302653 * top[0].std / 3 ** 0.5, rel=1e-6)


def test_top_vs_bottom_figure_exists_with_both_modes(tmp_path: Path) -> None:
    paths = plots.top_vs_bottom(_results(BOTH_MODES), tmp_path)
    assert paths == [tmp_path / "top_vs_bottom.png"]
    assert paths[0].stat().st_size > 10_000
    image = matplotlib.image.imread(paths[0])
    assert image.shape[0] > 300 and image.shape[1] > 300


def test_no_top_vs_bottom_figure_with_one_mode(tmp_path: Path) -> None:
    top_only = [c for c in BOTH_MODES if c.mode != "bottom"]
    assert plots.top_vs_bottom_panels(_results(top_only)) == {}
    assert plots.top_vs_bottom(_results(top_only), tmp_path) == []
    assert not list(tmp_path.iterdir())
