"""Paper-style views of the ablation cells: CSV (long, numeric), Markdown, HTML and rich tables.

Wide layout, one table per (model size, algorithm): rows = the base policy, then method × mode, the method
labelled with its scope and denominator (``ets-release [mini_batch, ÷all]``), columns = ratio × test
benchmark, cells ``mean ± half-width of the 95 % t interval (Δ GMTS − ETS paired by seed ± its half-width)``
in percent, each arm at the lr chosen on validation when it ran several (the title says which: ``lr_label``). The full-token baseline (method ``none``) and the base
have no ratio: their numbers are repeated under every ratio, as the reference line of each column. The CSV
keeps every cell (every lr, the validation benchmarks, the interval bounds).
"""

from __future__ import annotations

import csv
import html
import io
from dataclasses import dataclass

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sweeps.ablation import BASE, AblationResults, Cell, method_rank, mode_rank
from sweeps.labels import ratio_is_kept_share

PERCENT = 100.0
# Metrics that are not fractions of problems: shown as they are, not in percent.
RAW_METRICS = ("kl_to_base", "response_length")
ALL_TOKENS = "all"
LEGEND = "mean ± half-width of the 95 % t interval over seeds; Δ = GMTS − ETS paired by seed, ± its interval"


def seeds_label(cells: list[Cell]) -> str:
    """How many seeds the table's cells rest on: "1 seed" says plainly that there is no interval."""
    counts = sorted({c.n for c in cells if c.method != BASE})
    if not counts:
        return "no seeds"
    if counts == [1]:
        return "1 seed, no interval"
    return f"n = {counts[0]} seeds" if len(counts) == 1 else f"n = {counts[0]}–{counts[-1]} seeds per cell"


def lr_label(cells: list[Cell], source: str = "") -> str:
    """How the table's lrs were chosen, from the cells of every lr (not only the chosen ones): a grid
    chosen on validation, or one lr per arm that the spec fixed — then ``source`` (the spec's
    ``lr_source``) says who chose it, and without one the label says that nothing did."""
    lrs_by_arm: dict[tuple, set] = {}
    for cell in cells:
        if cell.method != BASE:
            lrs_by_arm.setdefault(_arm(cell), set()).add(cell.lr)
    if not lrs_by_arm:
        return ""
    if any(len(lrs) > 1 for lrs in lrs_by_arm.values()):
        if all(len(lrs) > 1 for lrs in lrs_by_arm.values()):
            return "each arm at its lr chosen on validation"
        return "lr chosen on validation for the arms that ran several, the spec's one lr for the others"
    single = {next(iter(lrs)) for lrs in lrs_by_arm.values()}
    if source:
        if len(single) > 1:
            return f"one lr per arm, from {source}"
        lr = next(iter(single))
        at = f"lr {lr:g}" if lr is not None else "its config's lr"
        return f"every arm at {at}, from {source}"
    if len(single) == 1:
        lr = next(iter(single))
        return f"every arm at lr {lr:g}, one lr set by the spec (not chosen on validation)" if lr is not None \
            else "every arm at its config's lr (not chosen on validation)"
    return "one lr per arm, set by the spec (not chosen on validation)"


@dataclass(frozen=True)
class WideTable:
    model_size: str
    algorithm: str
    metric: str
    columns: list[tuple[str, str]]  # (ratio label, benchmark)
    rows: list[tuple[str, str, list[str]]]  # (method label, mode label, one text per column)

    seeds: str = ""
    lrs: str = ""

    @property
    def title(self) -> str:
        unit = "" if self.metric in RAW_METRICS else " (%)"
        return "; ".join(part for part in (f"{self.metric}{unit} — model {self.model_size}, {self.algorithm}",
                                           self.seeds, self.lrs, LEGEND) if part)


def format_cell(cell: Cell | None) -> str:
    if cell is None:
        return ""
    scale, digits = (1.0, 3) if cell.metric in RAW_METRICS else (PERCENT, 1)
    text = f"{cell.mean * scale:.{digits}f}"
    if cell.ci_high is not None:
        text += f" ± {(cell.ci_high - cell.mean) * scale:.{digits}f}"
    if cell.delta_vs_ets is not None:
        text += f" (Δ {cell.delta_vs_ets * scale:+.{digits}f}"
        if cell.delta_ci_high is not None:
            text += f" ± {(cell.delta_ci_high - cell.delta_vs_ets) * scale:.{digits}f}"
        text += ")"
    return text


def wide_tables(results: AblationResults, metric: str = "accuracy") -> list[WideTable]:
    # The result is the test benchmarks at each arm's chosen lr; validation numbers only choose that lr.
    cells = [c for c in results.cells if c.metric == metric and c.split == "test"]
    cells = [c if ratio_is_kept_share(c.method) else _own_setting_row(c) for c in cells]
    lrs = {s: lr_label([c for c in cells if (c.model_size, c.algorithm) == s], results.lr_source)
           for s in {(c.model_size, c.algorithm) for c in cells}}
    chosen = {_arm(c) for c in cells if c.selected}
    # An arm with several lrs and no validation set to choose on shows every lr, each as its own row.
    cells = [c if c.selected else c.model_copy(update={"method": f"{c.method} lr={c.lr:g}"})
             for c in cells if c.selected or _arm(c) not in chosen]
    sections = sorted({(c.model_size, c.algorithm) for c in cells})
    return [_wide_table([c for c in cells if (c.model_size, c.algorithm) == s], *s, metric, lrs[s]) for s in sections]


def _own_setting_row(cell: Cell) -> Cell:
    """A method whose ρ is not the share of tokens kept (Clip-Cov's detached share, Archer's high-entropy
    share) or that has none (entropy-shaped advantages): one row with its ρ in the label, repeated under every
    ratio column like the full-token baseline, instead of a sparse entry in a column of kept shares."""
    label = cell.method if cell.ratio is None else f"{cell.method} ρ={cell.ratio:g}"
    return cell.model_copy(update={"method": label, "ratio": None, "mode": None})


def _arm(cell: Cell) -> tuple:
    return (cell.model_size, cell.algorithm, cell.method, cell.mode, cell.ratio)


def _wide_table(cells: list[Cell], model_size: str, algorithm: str, metric: str, lrs: str = "") -> WideTable:
    ratios = sorted({c.ratio for c in cells if c.ratio is not None})
    ratio_labels = [f"{r:g}" for r in ratios] or [ALL_TOKENS]
    benchmarks = sorted({c.benchmark for c in cells})
    columns = [(label, b) for label in ratio_labels for b in benchmarks]
    by_point = {(_row_label(c), c.mode, None if c.ratio is None else f"{c.ratio:g}", c.benchmark): c for c in cells}
    row_keys = sorted({(_row_label(c), c.method, c.mode) for c in cells},
                      key=lambda k: (method_rank(k[1]), k[0], mode_rank(k[2])))
    rows = []
    for row, _, mode in row_keys:
        texts = []
        for label, benchmark in columns:
            cell = by_point.get((row, mode, label, benchmark)) or by_point.get((row, mode, None, benchmark))
            texts.append(format_cell(cell))
        rows.append((row, mode or "—", texts))
    return WideTable(model_size, algorithm, metric, columns, rows, seeds_label(cells), lrs)


def _row_label(cell: Cell) -> str:
    """The method (a recipe's name, e.g. ets-release) with the population it ranked and what the
    policy-gradient term is normalised by: ``ets-release [mini_batch, ÷all]``."""
    if cell.scope is None and cell.denominator is None:
        return cell.method
    return f"{cell.method} [{cell.scope or '?'}, ÷{cell.denominator or '?'}]"


def to_markdown(results: AblationResults, tables: list[WideTable], extra: list[str] = ()) -> str:
    """``extra``: Markdown lines after the tables (the completions links, ``sweeps.completions``)."""
    lines = [f"# Ablation: sweep {results.sweep_id}", "", summary(results), ""]
    for table in tables:
        lines += [f"## {table.title}", "", *_markdown_rows(table), ""]
    return "\n".join([*lines, *extra])


def _markdown_rows(table: WideTable) -> list[str]:
    header = ["method", "mode"] + [f"ρ={r} {b}" if r != ALL_TOKENS else f"{r} {b}" for r, b in table.columns]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join([m, mode, *texts]) + " |" for m, mode, texts in table.rows)]


def to_note(results: AblationResults, tables: list[WideTable], description: str = "", extra: list[str] = ()) -> str:
    """The parent run's description (Markdown, shown collapsed to a few lines by the MLflow UI): the
    tables first, each followed by its title in small print, then the trials' count and the spec's text,
    then the ``extra`` lines."""
    lines: list[str] = []
    for table in tables:
        lines += [*_markdown_rows(table), "", f"*{table.title}*", ""]
    lines.append(summary(results) + (f". {description.strip()}" if description.strip() else ""))
    if extra:
        lines += ["", *extra]
    return "\n".join(lines)


_CSS = (
    "body{font-family:sans-serif}table{border-collapse:collapse;margin-bottom:2em}"
    "td,th{border:1px solid #999;padding:4px 8px;text-align:right}td:nth-child(-n+2){text-align:left}"
)


def to_html(results: AblationResults, tables: list[WideTable], extra: str = "") -> str:
    """``extra``: HTML after the tables (the completions links, ``sweeps.completions``)."""
    e = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>Ablation {e(results.sweep_id)}</title>",
        f"<style>{_CSS}</style>",
        f"</head><body><h1>Ablation: sweep {e(results.sweep_id)}</h1><p>{e(summary(results))}</p>",
    ]
    for table in tables:
        ratios = list(dict.fromkeys(r for r, _ in table.columns))
        per_ratio = len(table.columns) // len(ratios)
        parts.append(f"<h2>{e(table.title)}</h2><table><tr><th rowspan='2'>method</th><th rowspan='2'>mode</th>")
        parts += [f"<th colspan='{per_ratio}'>{'ρ = ' + e(r) if r != ALL_TOKENS else e(r)}</th>" for r in ratios]
        parts.append("</tr><tr>" + "".join(f"<th>{e(b)}</th>" for _, b in table.columns) + "</tr>")
        for method, mode, texts in table.rows:
            parts.append("<tr>" + "".join(f"<td>{e(t)}</td>" for t in (method, mode, *texts)) + "</tr>")
        parts.append("</table>")
    parts += [extra, "</body></html>"] if extra else ["</body></html>"]
    return "\n".join(parts)


def to_rich(results: AblationResults, tables: list[WideTable]) -> list[Group]:
    """One renderable per table: its title as lines of their own (a table's own title would wrap to the
    table's width, a few words a line) — what it is, then how its lrs were chosen — then the table. Cells
    are escaped: a row label such as ``ets-release [mini_batch, ÷all]`` is text, not rich markup."""
    views = []
    for table in tables:
        title = " · ".join(part for part in (f"model {table.model_size}", table.algorithm, table.seeds) if part)
        title += f"\n{table.lrs}" if table.lrs else ""
        view = Table()
        view.add_column("method")
        view.add_column("mode")
        for ratio, benchmark in table.columns:
            view.add_column(f"ρ={ratio}\n{benchmark}" if ratio != ALL_TOKENS else f"{ratio}\n{benchmark}", justify="right")
        for method, mode, texts in table.rows:
            view.add_row(*(escape(text) for text in (method, mode, *texts)))
        views.append(Group(Text(title, style="bold"), view))
    return views


CSV_FIELDS = ("model_size", "algorithm", "method", "scope", "denominator", "mode", "ratio", "lr", "selected",
              "benchmark", "split", "metric", "mean", "std", "n", "ci_low", "ci_high", "delta_vs_ets", "delta_ci_low",
              "delta_ci_high", "delta_n", "seeds", "values")


def to_csv(results: AblationResults) -> str:
    """Long format, one row per cell, numbers unrounded (for analysis, not for reading)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for cell in results.cells:
        row = cell.model_dump()
        row["seeds"] = " ".join(str(s) for s in cell.seeds)
        row["values"] = " ".join(repr(v) for v in cell.values)
        writer.writerow({k: "" if row[k] is None else row[k] for k in CSV_FIELDS})
    return out.getvalue()


def summary(results: AblationResults) -> str:
    text = f"{results.finished} finished trial(s)"
    if results.unfinished:
        text += f"; not in the table: {', '.join(f'{t.name} ({t.status})' for t in results.unfinished)}"
    return text
