"""What a method name of a sweep stands for, from the registries alone: a registered selection method
(``selection.SELECTION_METHODS``) or a recipe (``recipes.RECIPES``, a published convention of one).

Reports, plots, labels and the zoo's specs read these facts; none of them tests a method by its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workers.learner.recipes import RECIPES, selection_method_of

if TYPE_CHECKING:
    from workers.learner.selection import SelectionMethod


def _registry() -> dict[str, SelectionMethod]:
    # The registry lives beside its methods' torch code: imported on first use, so that what only names methods
    # (a report reading MLflow) starts without torch. One way only: selection imports nothing from here.
    from workers.learner.selection import SELECTION_METHODS

    return SELECTION_METHODS


def registered_method(name: str) -> SelectionMethod | None:
    """The registered method behind a method or recipe name; None for an unknown name."""
    return _registry().get(selection_method_of(name))


def comparison_partner(name: str) -> str | None:
    """The method or recipe a report pairs ``name`` with for its Δ (a recipe's own partner, else its method's);
    None when it has none."""
    if name in RECIPES and RECIPES[name].compared_with:
        return RECIPES[name].compared_with
    method = registered_method(name)
    return (method.compared_with or None) if method is not None else None


def keeps_every_token(name: str) -> bool:
    """Whether a method or recipe name neither scores nor selects (the full-token baseline)."""
    method = registered_method(name)
    return method is not None and method.keeps_every_token


def is_gmts_like(name: str) -> bool:
    """Whether a method or recipe name scores by |ω| (a GMTS variant)."""
    method = registered_method(name)
    return method is not None and method.gmts_like


def full_token_method() -> str:
    """The registered name of the full-token baseline (what a run that names no method ran: the config's default)."""
    from workers.learner.selection import SelectionConfig

    return SelectionConfig.model_fields["method"].default


def method_rank(name: str) -> int:
    """Where a method or recipe sits in tables and legends: the full-token baselines, then the recipes in their
    order, then the registered methods in the order they were registered; unknown names last."""
    methods = _registry()
    baselines = [n for n, m in methods.items() if m.keeps_every_token]
    order = [*baselines, *RECIPES, *(n for n in methods if n not in baselines)]
    return order.index(name) if name in order else len(order)


def zoo_points() -> list[dict[str, Any]]:
    """The method zoo: every registered method, then every recipe with a zoo point, each at its paper's default
    setting (its ``zoo_point``: the sweep axes it sets, e.g. scope, ratio, mode, kl_coef)."""
    return ([{"method": name, **method.zoo_point} for name, method in _registry().items()]
            + [{"method": name, **recipe.zoo_point} for name, recipe in RECIPES.items()
               if recipe.zoo_point is not None])
