"""Reference recipes: named selection settings that reproduce a published convention exactly.

A recipe is data: the SelectionConfig fields a published code path fixes (method, scope, rule,
apply_to, omega_aggregation_weight). ρ, mode and seed stay free. Use one as
``selection.recipe: ets-8020`` in a preset, or as a sweep's ``method`` value; the ablation table and
the MLflow param ``method`` show the recipe's name. Each recipe is tested against an independent
transcription of its reference's code path (tests/workers/learner/test_recipes.py).

What the loss around a recipe must also match (clip range, KL, aggregation) is the experiment's
``algorithm.loss``; the recipes below leave it to the preset, so that ETS and GMTS differ only in
what the recipe says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Recipe:
    fields: dict[str, Any]
    source: str  # the code path it reproduces
    summary: str
    compared_with: str = ""  # the recipe a report pairs it with for its Δ ("" = its method's partner, if any)
    color: str = ""  # "#rrggbb" in plots and MLflow charts; "" = a palette colour picked by name
    # Its point in the method zoo (sweeps' ``zoo``: ratio, mode, …); None = not in the zoo (its method is).
    zoo_point: dict[str, Any] | None = None


RECIPES: dict[str, Recipe] = {
    "ets-8020": Recipe(
        fields={"method": "ets", "scope": "micro_batch", "rule": "count", "apply_to": "loss",
                "omega_aggregation_weight": True},
        source="Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR, verl/trainer/ppo/core_algos.py: "
               "get_global_entropy_top_mask, compute_policy_loss_vanilla(entropy_top_mask=...); "
               "verl/workers/actor/dp_actor.py: update_policy",
        summary="top ⌈ρ·n⌉ by entropy over each micro-batch on each rank; the policy-gradient term aggregated "
                "over the selected tokens only; KL and entropy bonus over every response token (exact under the "
                "token-mean of its runs; under seq-mean-* its agg_loss counts answers with no selected token, "
                "NaN for seq-mean-token-mean, which is not copied)",
        color="#bcbd22",
    ),
    "ets-trl": Recipe(
        fields={"method": "ets", "scope": "global_micro_batch", "rule": "quantile", "apply_to": "advantage",
                "omega_aggregation_weight": True},
        source="huggingface/trl, trl/trainer/grpo_trainer.py: GRPOTrainer.get_high_entropy_mask, "
               "GRPOTrainer._compute_loss (top_entropy_quantile)",
        summary="entropy ≥ the linear-interpolated (1 − ρ)-quantile of the micro-batch gathered across processes, "
                "ties kept; the policy-gradient term multiplied by the mask, denominators and KL unchanged",
        color="#7f7f7f",
    ),
    "ets-release": Recipe(
        fields={"method": "ets", "scope": "mini_batch", "rule": "count", "apply_to": "advantage",
                "omega_aggregation_weight": True},
        source="the GMTS release's verl fork (its ETS baseline)",
        summary="top ⌈ρ·n⌉ by entropy over the optimiser step's mini-batch on each rank; unselected tokens' "
                "advantage zeroed; denominators and KL unchanged",
        color="#17becf", zoo_point={"ratio": 0.2, "mode": "top"},
    ),
    "gmts-release": Recipe(
        fields={"method": "gmts", "scope": "group", "rule": "count", "apply_to": "advantage",
                "omega_aggregation_weight": False},
        source="the GMTS release's verl fork (its GMTS selection, every group rather than only the first)",
        summary="top ⌈ρ·n⌉ by H·|ω| (ω without the aggregation weight) within each prompt group, zero scores "
                "ineligible; unselected tokens' advantage zeroed; denominators and KL unchanged",
        compared_with="ets-release", color="#e377c2", zoo_point={"ratio": 0.2, "mode": "top"},
    ),
    "gmts-paper": Recipe(
        fields={"method": "gmts", "scope": "global", "rule": "count", "apply_to": "loss",
                "omega_aggregation_weight": True},
        source="the GMTS paper, Eq. 2",
        summary="top ⌈ρ·n⌉ by H·|ω| over the whole batch of an optimiser step (every rank); the policy-gradient "
                "term normalised by the number of selected tokens",
        compared_with="ets-release", color="#8c564b",
    ),
}


def recipe_fields(name: str) -> dict[str, Any]:
    try:
        return dict(RECIPES[name].fields)
    except KeyError:
        raise ValueError(f"recipe: unknown recipe {name!r}; known: {sorted(RECIPES)}") from None


def selection_method_of(name: str) -> str:
    """The selection method behind a sweep's method value: a recipe's own method, else the name itself."""
    return RECIPES[name].fields["method"] if name in RECIPES else name
