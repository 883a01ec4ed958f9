"""The sweep's figures (PNG, matplotlib's Agg backend: no display needed).

- accuracy vs selection ratio, one panel per benchmark × mode (top / bottom), a line per method
  (mean ± std over seeds) and the full-token baseline as a dashed line;
- learning curves: per-step training metrics, mean over seeds, one line per method/mode/ratio;
- entropy vs gradient norm G = ‖e_o − p‖ of the tokens of one diagnostic batch, with the
  within-answer Spearman correlation (the paper's motivating figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb

from sweeps.ablation import AblationResults, method_rank

METHOD_COLORS = {"none": "0.4", "ets": "tab:blue", "gmts": "tab:red", "gmts_exact": "tab:orange", "random": "tab:green",
                 "ets-release": "tab:cyan", "ets-8020": "tab:olive", "ets-trl": "tab:gray", "gmts-release": "tab:pink",
                 "gmts-paper": "tab:brown"}
MODES = ("top", "bottom")
SMOOTHING = 10  # steps in the learning curves' moving average


@dataclass(frozen=True)
class Curve:
    """One learning curve: a per-step metric averaged over the seeds of one grid point."""

    model_size: str
    algorithm: str
    method: str
    mode: str | None
    ratio: float | None
    metric: str
    steps: list[int]
    values: list[float]

    @property
    def label(self) -> str:
        return self.method if self.ratio is None else f"{self.method} {self.mode} {self.ratio:g}"


def accuracy_vs_ratio(results: AblationResults, folder: Path, metric: str = "accuracy") -> list[Path]:
    cells = [c for c in results.cells if c.metric == metric]
    sections = sorted({(c.model_size, c.algorithm) for c in cells})
    paths = []
    for model_size, algorithm in sections:
        mine = [c for c in cells if (c.model_size, c.algorithm) == (model_size, algorithm)]
        benchmarks = sorted({c.benchmark for c in mine})
        modes = [m for m in MODES if any(c.mode == m for c in mine)] or [MODES[0]]
        fig, axes = plt.subplots(len(benchmarks), len(modes), figsize=(max(8.0, 5.5 * len(modes)), 3.6 * len(benchmarks) + 0.6),
                                 squeeze=False)
        for row, benchmark in enumerate(benchmarks):
            for col, mode in enumerate(modes):
                ax = axes[row][col]
                for cell in (c for c in mine if c.benchmark == benchmark and c.method == "none"):
                    ax.axhline(cell.mean, color=METHOD_COLORS["none"], linestyle="--", label="none (all tokens)")
                methods = sorted({c.method for c in mine if c.mode == mode and c.ratio is not None}, key=method_rank)
                for method in methods:
                    points = sorted(
                        (c for c in mine if (c.benchmark, c.method, c.mode) == (benchmark, method, mode)),
                        key=lambda c: c.ratio,
                    )
                    ax.errorbar(
                        [c.ratio for c in points], [c.mean for c in points], yerr=[c.std or 0.0 for c in points],
                        marker="o", capsize=3, color=METHOD_COLORS.get(method), label=method,
                    )
                ax.set_title(f"{benchmark} — {mode} ρ")
                ax.set_xlabel("selection ratio ρ")
                ax.set_ylabel(metric)
                ax.set_xlim(0, 1)
                ax.grid(alpha=0.3)
                if ax.has_data():
                    ax.legend(fontsize=8)
        fig.suptitle(f"{metric} vs selection ratio — model {model_size}, {algorithm}\n(mean ± std over seeds)")
        fig.tight_layout()
        suffix = "" if len(sections) == 1 else f"_{model_size}_{algorithm}"
        paths.append(_save(fig, folder / f"accuracy_vs_ratio{suffix}.png"))
    return paths


def learning_curves(curves: list[Curve], path: Path) -> Path | None:
    if not curves:
        return None
    sections = sorted({(c.model_size, c.algorithm) for c in curves})
    metrics = sorted({c.metric for c in curves})
    fig, axes = plt.subplots(len(sections), len(metrics), figsize=(6 * len(metrics), 3.8 * len(sections)), squeeze=False)
    for row, section in enumerate(sections):
        for col, metric in enumerate(metrics):
            ax = axes[row][col]
            mine = [c for c in curves if (c.model_size, c.algorithm) == section and c.metric == metric]
            for curve in sorted(mine, key=lambda c: (method_rank(c.method), c.mode or "", c.ratio or 0.0)):
                style = "--" if curve.mode == "bottom" else "-"
                ratios = sorted({c.ratio or 0.0 for c in mine if c.method == curve.method})
                color = _shade(METHOD_COLORS.get(curve.method, "k"), ratios.index(curve.ratio or 0.0), len(ratios))
                ax.plot(curve.steps, curve.values, style, color=color, alpha=0.25, linewidth=0.8)
                ax.plot(curve.steps, _smoothed(curve.values), style, color=color, label=curve.label)
            ax.set_title(f"{metric} — model {section[0]}, {section[1]}")
            ax.set_xlabel("RL step")
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
            if mine:
                ax.legend(fontsize=7)
    fig.suptitle(f"Learning curves (mean over seeds; faint: raw, bold: moving average over {SMOOTHING} steps)")
    fig.tight_layout()
    return _save(fig, path)


def entropy_vs_gradnorm(entropy: list[float], grad_norm: list[float], spearman: float, path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 5))
    size = 14 if len(entropy) < 2000 else 4
    ax.scatter(entropy, grad_norm, s=size, alpha=0.4, color="tab:purple", edgecolors="none")
    ax.set_xlabel("token entropy H")
    ax.set_ylabel("gradient norm G = ‖e_o − p‖₂")
    ax.set_title(f"{title}\nwithin-answer Spearman ρ = {spearman:.3f} ({len(entropy)} tokens)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _smoothed(values: list[float], window: int = SMOOTHING) -> list[float]:
    """Trailing moving average (the first points average what there is so far)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _shade(color: str, index: int, count: int) -> tuple[float, float, float]:
    """The method's colour, lighter for each further ratio (darkest = smallest ratio)."""
    mix = 0.0 if count <= 1 else 0.6 * index / (count - 1)
    return tuple(c + (1.0 - c) * mix for c in to_rgb(color))  # type: ignore[return-value]


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
