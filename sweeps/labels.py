"""Names a person reads: "GMTS-release top-20 % · seed 0" for a trial, ``gmts-release_top0.2`` for a metric key.

A method's display name comes from the selection-method registry (``workers.learner.selection``) and the
recipes (``workers.learner.recipes``), never from a list kept here: a method that keeps every token (no
score, no selection of its own) reads "All tokens"; any other is its registered name in capitals (``ets`` →
"ETS"), a recipe its method's display name followed by the rest of its own name (``gmts-release`` →
"GMTS-release"). A method registered with a ``display_name`` fact uses that instead.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from typing import Any

from workers.learner.methods import full_token_method
from workers.learner.recipes import RECIPES, selection_method_of

SEPARATOR = " · "
ALL_TOKENS = "All tokens"
# The characters MLflow accepts in a metric key (alphanumerics, _ - . / space and colon); others become '_'.
_UNSAFE_KEY = re.compile(r"[^\w.\-/]")
# One colour per method in the plots and the MLflow charts (tag mlflow.runColor): a method's or recipe's own
# ``color`` fact (matplotlib's tab10: ETS blue, GMTS red everywhere), else a palette colour picked by its name.
BASE_COLOR = "#000000"  # the base policy's row (step 0): not a method
PALETTE = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#2ca02c", "#ff7f0e")


def method_display(name: str) -> str:
    """The display name of a selection method or reference recipe (see the module docstring)."""
    # The registry is torch code: imported here, so that the report (which names arms) reads MLflow without it.
    from workers.learner.selection import SELECTION_METHODS

    method = selection_method_of(name)
    registered = SELECTION_METHODS.get(method)
    if registered is None:
        return name
    shown = registered.display_name or (ALL_TOKENS if registered.keeps_every_token else method.upper())
    if name in RECIPES:
        return shown + name[len(method):] if name.startswith(method) else f"{shown} ({name})"
    return shown


def ratio_is_kept_share(name: str) -> bool:
    """The method's ρ is the share of tokens it keeps (top-ρ selection), not a setting of its own (Clip-Cov's
    detached share, Archer's high-entropy share); unknown names count as selection."""
    from workers.learner.selection import SELECTION_METHODS

    registered = SELECTION_METHODS.get(selection_method_of(name))
    return registered is None or registered.ratio_is_kept_share


def method_color(name: str) -> str:
    """The method's colour as ``#rrggbb`` (stable across runs and processes: crc32, not hash())."""
    from workers.learner.selection import SELECTION_METHODS

    if name == "base":
        return BASE_COLOR
    registered = SELECTION_METHODS.get(name)
    own = RECIPES[name].color if name in RECIPES else registered.color if registered is not None else ""
    return own or PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


def arm_label(method: str, mode: str | None = None, ratio: float | None = None, *, scope: str | None = None,
              denominator: str | None = None, lr: float | None = None, model_size: str | None = None,
              algorithm: str | None = None) -> str:
    """One arm of a comparison: the method, what share of tokens it keeps, and any axis set apart from it."""
    parts = [method_display(method)]
    if ratio is not None:
        parts[0] += f" {mode or 'top'}-{ratio * 100:g} %" if ratio_is_kept_share(method) else f" ρ={ratio:g}"
    if scope is not None or denominator is not None:
        parts.append(" ".join(p for p in (scope, None if denominator is None else f"÷{denominator}") if p))
    if lr is not None:
        parts.append(f"lr {lr:g}")
    parts += [p for p in (model_size, algorithm) if p]
    return SEPARATOR.join(parts)


def trial_label(point: Mapping[str, Any]) -> str:
    """A trial's name from its grid point (``sweeps.spec.Trial.point``): only the axes the grid varies."""
    label = arm_label(point.get("method") or full_token_method(), point.get("mode"), point.get("ratio"),
                      scope=point.get("scope"), denominator=point.get("denominator"), lr=point.get("lr"),
                      model_size=point.get("model_size"), algorithm=point.get("algorithm"))
    return label if "seed" not in point else f"{label}{SEPARATOR}seed {point['seed']}"


def arm_key(method: str, mode: str | None = None, ratio: float | None = None, *, scope: str | None = None,
            denominator: str | None = None, lr: float | None = None, model_size: str | None = None,
            algorithm: str | None = None) -> str:
    """The same arm as one MLflow-safe metric-key segment: ``gmts-release_top0.2``, ``none``."""
    parts = [method]
    if ratio is not None:
        parts.append(f"{mode or 'top'}{ratio:g}")
    parts += [str(p) for p in (scope, denominator) if p]
    if lr is not None:
        parts.append(f"lr{lr:g}")
    parts += [p for p in (model_size, algorithm) if p]
    return _UNSAFE_KEY.sub("_", "_".join(parts))
