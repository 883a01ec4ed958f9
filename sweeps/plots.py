"""The sweep's figures (PNG, matplotlib's Agg backend: no display needed).

- accuracy vs selection ratio, one panel per test benchmark × mode (top / bottom), a line per method
  (mean and 95 % t interval over seeds, each arm at its lr chosen on validation), the full-token
  baseline as a dashed line and the base policy as a dotted one;
- top-ρ vs bottom-ρ selection (when a method ran in both modes): one panel per test benchmark × method,
  accuracy vs ρ for each mode with the same intervals, the baselines as above;
- accuracy vs learning rate (when an arm has several): one panel per benchmark, validation and test,
  a line per arm, the lr each arm's validation mean chose circled;
- evaluation curves: the eval metric against the RL step, one panel per test benchmark, one line per arm
  (mean over seeds) with its 95 % t band where there are several seeds;
- learning curves: the training reward per step, mean over seeds, one line per method/mode/ratio (for a 0/1
  reward ``train/accuracy`` is the same number, so it gets no panel of its own);
- entropy vs gradient norm G = ‖e_o − p‖ of the tokens of one diagnostic batch on log–log axes, with the
  within-answer Pearson of log H vs log G, the within-answer Spearman of H vs G, and the per-group Spearman
  of the GMTS score H·|ω| against the true logits-gradient norm |ω|·G (the paper's diagnostic figure);
- where the tokens go (a task with token roles, e.g. worked addition): per arm, the share of the selected tokens
  that are decisions against the RL step with its base rate among all response tokens dashed, and the roles of
  the selected tokens at the last step as bars.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb

from sweeps.ablation import BASE, AblationResults, Cell, method_rank
from sweeps.labels import method_color, method_display
from workers.learner.methods import keeps_every_token
MODES = ("top", "bottom")
SMOOTHING = 10  # steps in the learning curves' moving average
DODGE = 0.012  # x offset of the bottom-ρ points in top_vs_bottom


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
    cells = [c for c in results.cells if c.metric == metric and c.split == "test" and c.selected]
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
                for cell in (c for c in mine if c.benchmark == benchmark and keeps_every_token(c.method)):
                    ax.axhline(cell.mean, color=method_color(cell.method), linestyle="--",
                               label=method_display(cell.method))
                for cell in (c for c in mine if c.benchmark == benchmark and c.method == BASE):
                    ax.axhline(cell.mean, color="k", linestyle=":", label="base (step 0)")
                methods = sorted({c.method for c in mine if c.mode == mode and c.ratio is not None}, key=method_rank)
                for method in methods:
                    points = sorted(
                        (c for c in mine if (c.benchmark, c.method, c.mode) == (benchmark, method, mode)),
                        key=lambda c: c.ratio,
                    )
                    ax.errorbar(
                        [c.ratio for c in points], [c.mean for c in points], yerr=[_half_width(c) for c in points],
                        marker="o", capsize=3, color=method_color(method), label=method,
                    )
                ax.set_title(f"{benchmark} — {mode} ρ")
                ax.set_xlabel("selection ratio ρ")
                ax.set_ylabel(metric)
                ax.set_xlim(0, 1)
                ax.grid(alpha=0.3)
                if ax.has_data():
                    ax.legend(fontsize=8)
        fig.suptitle(f"{metric} vs selection ratio — model {model_size}, {algorithm}\n(mean, 95 % t interval over seeds)")
        fig.tight_layout()
        suffix = "" if len(sections) == 1 else f"_{model_size}_{algorithm}"
        paths.append(_save(fig, folder / f"accuracy_vs_ratio{suffix}.png"))
    return paths


# (model_size, algorithm) → (benchmark, method) → mode → that arm's cells, by ratio
TopBottomPanels = dict[tuple[str, str], dict[tuple[str, str], dict[str, list[Cell]]]]


def top_vs_bottom_panels(results: AblationResults, metric: str = "accuracy") -> TopBottomPanels:
    """What :func:`top_vs_bottom` draws: the test cells (each arm at its chosen lr) of every method that ran
    both modes in a section, per benchmark and mode, by ratio. Empty when no method ran both."""
    cells = [c for c in results.cells if c.metric == metric and c.split == "test" and c.selected
             and c.mode in MODES and c.ratio is not None]
    panels: TopBottomPanels = {}
    for section in sorted({(c.model_size, c.algorithm) for c in cells}):
        mine = [c for c in cells if (c.model_size, c.algorithm) == section]
        both = {c.method for c in mine if c.mode == "top"} & {c.method for c in mine if c.mode == "bottom"}
        for benchmark in sorted({c.benchmark for c in mine}):
            for method in sorted(both, key=method_rank):
                by_mode = {mode: sorted((c for c in mine if (c.benchmark, c.method, c.mode) == (benchmark, method, mode)),
                                        key=lambda c: c.ratio) for mode in MODES}
                if all(by_mode.values()):
                    panels.setdefault(section, {})[(benchmark, method)] = by_mode
    return panels


def top_vs_bottom(results: AblationResults, folder: Path, metric: str = "accuracy") -> list[Path]:
    """Top-ρ against bottom-ρ selection: per section a grid of panels (rows: test benchmarks, columns: the
    methods run in both modes), accuracy against ρ for each mode (mean and 95 % t interval over seeds), the
    full-token and base rows as lines. No figure (an empty list) when no method ran both modes."""
    baselines = [c for c in results.cells if c.metric == metric and c.split == "test" and c.selected
                 and (c.method == BASE or keeps_every_token(c.method))]
    panels = top_vs_bottom_panels(results, metric)
    paths = []
    for (model_size, algorithm), arms in panels.items():
        benchmarks = sorted({b for b, _ in arms})
        methods = sorted({m for _, m in arms}, key=method_rank)
        fig, axes = plt.subplots(len(benchmarks), len(methods), squeeze=False,
                                 figsize=(max(6.0, 4.8 * len(methods)), 3.6 * len(benchmarks) + 0.6))
        for (benchmark, method), by_mode in arms.items():
            ax = axes[benchmarks.index(benchmark)][methods.index(method)]
            for cell in baselines:
                if (cell.model_size, cell.algorithm, cell.benchmark) == (model_size, algorithm, benchmark):
                    every_token = cell.method != BASE
                    ax.axhline(cell.mean, color=method_color(cell.method), linestyle="--" if every_token else ":",
                               label=method_display(cell.method) if every_token else "base (step 0)")
            # The bottom points sit a hair to the right (DODGE) so that two intervals at one ρ stay apart.
            for mode, marker, style, dodge in (("top", "o", "-", 0.0), ("bottom", "v", "--", DODGE)):
                points = by_mode[mode]
                ax.errorbar([c.ratio + dodge for c in points], [c.mean for c in points],
                            yerr=[_half_width(c) for c in points],
                            marker=marker, linestyle=style, capsize=3, color=method_color(method),
                            alpha=1.0 if mode == "top" else 0.65, label=f"{method} {mode}-ρ")
            ax.set_title(f"{benchmark} — {method}")
            ax.set_xlabel("selection ratio ρ")
            ax.set_ylabel(metric)
            ax.set_xlim(0, 1 + 2 * DODGE)  # ρ = 1 and its dodged bottom point stay inside
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        for row, col in ((r, c) for r in range(len(benchmarks)) for c in range(len(methods))):
            if not axes[row][col].has_data():
                axes[row][col].set_axis_off()  # this method has no cells on this benchmark
        fig.suptitle(f"Top-ρ vs bottom-ρ selection — model {model_size}, {algorithm}\n"
                     f"final {metric} (mean, 95 % t interval over seeds)")
        fig.tight_layout()
        suffix = "" if len(panels) == 1 else f"_{model_size}_{algorithm}"
        paths.append(_save(fig, folder / f"top_vs_bottom{suffix}.png"))
    return paths


def accuracy_vs_lr(results: AblationResults, path: Path, metric: str = "accuracy") -> Path | None:
    """The whole lr curve of every arm that was run at more than one lr (None when none was)."""
    cells = [c for c in results.cells if c.metric == metric and c.lr is not None and c.method != BASE]
    arms: dict[tuple, list[Cell]] = {}
    for cell in cells:
        arms.setdefault((cell.model_size, cell.algorithm, cell.method, cell.mode, cell.ratio), []).append(cell)
    arms = {arm: mine for arm, mine in arms.items() if len({c.lr for c in mine}) > 1}
    if not arms:
        return None
    panels = sorted({(c.split != "validation", c.benchmark) for mine in arms.values() for c in mine})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (is_test, benchmark) in zip(axes[0], panels, strict=True):
        for (model_size, algorithm, method, mode, ratio), mine in sorted(arms.items(), key=lambda kv: method_rank(kv[0][2])):
            points = sorted((c for c in mine if c.benchmark == benchmark), key=lambda c: c.lr)
            if not points:
                continue
            label = method if ratio is None else f"{method} {mode} {ratio:g}"
            color = method_color(method)
            ax.errorbar([c.lr for c in points], [c.mean for c in points], yerr=[_half_width(c) for c in points],
                        marker="o", capsize=3, color=color, label=f"{label} ({model_size}, {algorithm})")
            for chosen in (c for c in points if c.selected):
                ax.plot([chosen.lr], [chosen.mean], "o", markersize=12, markerfacecolor="none", color=color)
        ax.set_xscale("log")
        ax.set_title(f"{benchmark} ({'test' if is_test else 'validation'})")
        ax.set_xlabel("learner lr")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    fig.suptitle(f"{metric} vs learning rate (mean, 95 % t interval over seeds; circled: chosen on validation)")
    fig.tight_layout()
    return _save(fig, path)


def _half_width(cell: Cell) -> float:
    return 0.0 if cell.ci_high is None else cell.ci_high - cell.mean


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
                color = _shade(method_color(curve.method), ratios.index(curve.ratio or 0.0), len(ratios))
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


@dataclass(frozen=True)
class EvalCurve:
    """One arm's eval metric against the step: the mean over seeds and its 95 % t band at each step."""

    model_size: str
    algorithm: str
    benchmark: str
    method: str
    label: str
    steps: list[int]
    mean: list[float]
    low: list[float | None]  # None where only one seed reached the step
    high: list[float | None]


def eval_curves(curves: list[EvalCurve], path: Path, metric: str = "accuracy") -> Path | None:
    if not curves:
        return None
    panels = sorted({(c.model_size, c.algorithm, c.benchmark) for c in curves})
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        mine = sorted((c for c in curves if (c.model_size, c.algorithm, c.benchmark) == panel),
                      key=lambda c: (method_rank(c.method), c.label))
        for curve in mine:
            color = method_color(curve.method)
            ax.plot(curve.steps, curve.mean, "o-", color=color, label=curve.label, markersize=4)
            banded = [(s, lo, hi) for s, lo, hi in zip(curve.steps, curve.low, curve.high, strict=True) if lo is not None]
            if banded:
                steps, low, high = zip(*banded, strict=True)
                ax.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
        ax.set_title(f"{panel[2]} — model {panel[0]}, {panel[1]}")
        ax.set_xlabel("RL step")
        ax.set_ylabel(f"eval {metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Evaluation {metric} during training (mean over seeds; band: 95 % t interval where n ≥ 2)")
    fig.tight_layout()
    return _save(fig, path)


def entropy_vs_gradnorm(entropy: list[float], grad_norm: list[float], numbers: dict[str, float], path: Path,
                        title: str) -> Path:
    """The paper's diagnostic figure on log–log axes, annotated with the batch's correlations (``numbers``:
    ``sweeps.report.DIAGNOSTIC_METRICS`` keys; a missing one is shown as "n/a"). Tokens with H = 0 or
    G = 0 have no place on log axes and are counted in the title instead."""
    points = [(h, g) for h, g in zip(entropy, grad_norm, strict=True) if h > 0 and g > 0]
    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    size = 14 if len(points) < 2000 else 4
    if points:
        ax.scatter(*zip(*points, strict=True), s=size, alpha=0.4, color="tab:purple", edgecolors="none")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("token entropy H (log scale)")
    ax.set_ylabel("gradient norm G = ‖e_o − p‖₂ (log scale)")
    left_out = len(entropy) - len(points)
    ax.set_title(f"{title}\n{len(points)} tokens" + (f" ({left_out} with H = 0 or G = 0 not shown)" if left_out else ""),
                 fontsize=10)
    shown = lambda key: f"{numbers[key]:.3f}" if key in numbers else "n/a"
    ax.text(0.03, 0.97, "\n".join((
        f"within-answer Pearson r(log H, log G) = {shown('diagnostics/pearson_log_entropy_log_gradnorm')}",
        f"within-answer Spearman ρ(H, G) = {shown('diagnostics/spearman_entropy_gradnorm')}",
        f"per-group Spearman ρ(H·|ω|, |ω|·G) = {shown('diagnostics/spearman_gmts_score_true_gradnorm')}",
    )), transform=ax.transAxes, va="top", fontsize=8, bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "0.7"})
    ax.grid(alpha=0.3, which="both")
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


@dataclass(frozen=True)
class TokenRoute:
    """Where one arm's selected tokens went (``selection/decision_share``, ``selection/role_share/<role>``)."""

    model_size: str
    algorithm: str
    method: str
    mode: str | None
    label: str
    steps: list[int]
    decision_share: list[float]  # mean over seeds at each step
    base_share: list[float]  # decision_base_share, the same
    role_share: dict[str, float]  # role → share of the selected tokens at the last step, mean over seeds


def where_tokens_go(routes: list[TokenRoute], path: Path) -> Path | None:
    """Per (model size, algorithm): decision share against the step, and the last step's roles as grouped bars."""
    if not routes:
        return None
    sections = sorted({(r.model_size, r.algorithm) for r in routes})
    fig, axes = plt.subplots(len(sections), 2, figsize=(13, 4.4 * len(sections)), squeeze=False)
    for (curve_ax, bar_ax), section in zip(axes, sections, strict=True):
        mine = sorted((r for r in routes if (r.model_size, r.algorithm) == section),
                      key=lambda r: (method_rank(r.method), r.label))
        for index, route in enumerate(mine):
            color = _shade(method_color(route.method), sum(r.method == route.method for r in mine[:index]),
                           sum(r.method == route.method for r in mine))
            style = "-." if route.mode == "bottom" else "-"
            curve_ax.plot(route.steps, route.decision_share, style, color=color, label=route.label)
            curve_ax.plot(route.steps, route.base_share, "--", color=color, alpha=0.5, linewidth=0.9)
        curve_ax.set_title(f"selected tokens that are decisions — model {section[0]}, {section[1]}")
        curve_ax.set_xlabel("RL step")
        curve_ax.set_ylabel("decision share (dashed: among all response tokens)")
        curve_ax.set_ylim(0, 1)
        curve_ax.grid(alpha=0.3)
        curve_ax.legend(fontsize=7)
        roles = list(dict.fromkeys(role for r in mine for role in r.role_share))
        width = 0.8 / len(mine)
        for index, route in enumerate(mine):
            color = _shade(method_color(route.method), sum(r.method == route.method for r in mine[:index]),
                           sum(r.method == route.method for r in mine))
            xs = [i + (index - (len(mine) - 1) / 2) * width for i in range(len(roles))]
            bar_ax.bar(xs, [route.role_share.get(role, 0.0) for role in roles], width, color=color,
                       hatch="//" if route.mode == "bottom" else None, label=route.label)
        bar_ax.set_xticks(range(len(roles)), roles)
        bar_ax.set_title(f"roles of the selected tokens at the last step — model {section[0]}, {section[1]}")
        bar_ax.set_xlabel("role")
        bar_ax.set_ylabel("share of the selected tokens")
        bar_ax.grid(alpha=0.3, axis="y")
        bar_ax.legend(fontsize=7)
    fig.suptitle("Where the tokens go (mean over seeds; roles from the task's grammar)")
    fig.tight_layout()
    return _save(fig, path)
