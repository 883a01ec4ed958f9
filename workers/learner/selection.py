"""Token selection: which response tokens keep the policy gradient.

One entry point, :func:`select_tokens`, ranks the response tokens of a population by a per-token
score and keeps the top (or bottom) ρ of the eligible tokens of each ranking population.

Scores (``SelectionConfig.method``):
- ``none``: every response token is kept (the full-token baseline).
- ``ets``: H_t, the token entropy (the "80/20" paper).
- ``gmts``: H_t · |ω_t|, entropy times the token's effective gradient coefficient (GMTS paper).
- ``gmts_exact``: G_t · |ω_t| with G_t = ‖e_o − p‖₂, the exact gradient norm of log π(o_t) with
  respect to the logits, of which the entropy is the paper's proxy. Then the score is exactly the
  ℓ2 norm of the token's gradient of the loss w.r.t. its logits.
- ``random``: uniform scores from a seeded generator (a control for "any ρ-subset").
- ``h_abs_adv``: H_t · |A_t|, what GMTS reduces to on-policy (r = 1, no KL): it cannot reorder the
  tokens of one answer beyond their entropy, only move budget between answers;
- ``abs_omega``: |ω_t| alone, no entropy: with ``gmts`` and ``h_abs_adv`` a grid tells which factor
  carries the gain.

The rest of the zoo treats tokens rather than ranking them for a top-ρ mask (their cores, with the
papers, in :mod:`workers.learner.token_methods`): ``clip_cov`` (detach a random ρ of the tokens in a
covariance band), ``kl_cov`` (|log r| penalty on the top ρ by covariance, no clip), ``entropy_adv``
(A + min(α·H, |A|/κ), no mask), ``archer`` (the top ρ by entropy get a looser clip and a weaker KL). Such a
method registers a ``select`` function returning the whole :class:`Selection`, with the per-token loss
settings (:class:`workers.learner.losses.TokenTerms`) the loss and ω both read.

ω_t is :func:`workers.learner.losses.effective_grad_coef` of the loss actually optimised.
Each method is registered (:func:`register_selection_method`) with its facts — what it reads
(logp, G), whether zero scores leave the population, whether it is a GMTS variant — and the config,
the engine and the sweeps' reports read those facts from :data:`SELECTION_METHODS` only.

Eligibility: every response token; for the gmts methods (``drops_zero_scores``), tokens whose score is exactly zero
(A = 0, or on a clipped branch with no KL) carry no policy gradient and are left out of the
ranking population, as in the released GMTS code — so ρ is a fraction of the tokens that
*could* move the policy.

Populations (``scope``), each named for what it ranks:
- ``group``: each prompt's group of rollouts (the GMTS release; its loop only reached the first
  group, a bug not repeated here);
- ``response``: each response on its own (Archer's code ranks entropy per response); exact in any
  micro-batch, since a micro-batch holds whole responses;
- ``micro_batch``: the tokens of one forward/backward pass on this rank (the "80/20" code);
- ``mini_batch``: every token of one optimiser step on this rank, across its micro-batches and
  token-budget pieces (the GMTS release's ETS). The learner scores the mini-batch in one no-grad
  pass before its first backward when it has more than one micro-batch; none when it is one;
- ``global_micro_batch``: one forward's micro-batch on every data-parallel rank (what TRL's
  ``get_high_entropy_mask`` gathers: one threshold per ``compute_loss`` call across processes);
- ``global``: every token of one optimiser step on every rank (the paper's Eq. 2 "over the batch").
The caller hands :func:`select_tokens` the tensors of the population (one micro-batch, or a
mini-batch concatenated); ``global*`` scopes gather the scores of every rank of a process group.

How many (``rule``):
- ``count``: exactly ⌈ρ·n⌉ of the n eligible tokens. Tokens with bit-identical scores (a context
  shared by several samples has identical entropy) are ordered by a seeded random permutation, not
  by row position, so a threshold that falls inside a tie favours no row and no advantage sign;
- ``quantile``: every token whose score is ≥ the linear-interpolated (1 − ρ)-quantile of the
  population (≤ the ρ-quantile for ``mode='bottom'``), ties kept — TRL's ``top_entropy_quantile``.

Named settings that reproduce a published convention exactly live in
:mod:`workers.learner.recipes` (``SelectionConfig(recipe='ets-8020')``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from workers.learner.losses import PolicyLossConfig, TokenTerms, clip_masks, effective_grad_coef
from workers.learner.token_methods import (ArcherConfig, CovarianceConfig, EntropyAdvantageConfig, archer_terms,
                                           clip_cov_detached, entropy_shaped_advantages, high_entropy_per_response,
                                           kl_cov_penalised, token_covariance)
from workers.learner.recipes import RECIPES, recipe_fields
from workers.registry import Registered


@dataclass(frozen=True)
class ScoreInputs:
    """What a selection method may read, per token [B, T] (``advantages`` broadcast to [B, T])."""

    config: SelectionConfig
    loss_config: PolicyLossConfig
    mask: torch.Tensor
    entropy: torch.Tensor
    advantages: torch.Tensor
    logp: torch.Tensor | None
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    grad_norm: torch.Tensor | None
    generator: torch.Generator | None
    group_ids: torch.Tensor | None = None  # [B]: each row's prompt


@dataclass(frozen=True)
class Population:
    """Where a ``select`` method's population lives: its ranks, and the draws every rank shares."""

    process_group: dist.ProcessGroup | None
    cross_rank: bool  # the scope spans every data-parallel rank
    tie_break: torch.Generator  # the same draw on every rank (cross-rank random choices use it)


KEPT_SHARE = "share of eligible tokens kept"


@dataclass(frozen=True)
class SelectionMethod:
    """A registered token method and what the rest of the lab (config, engine, sweeps, docs) knows about it."""

    name: str
    score: Callable[[ScoreInputs], torch.Tensor] | None  # None: keep every response token (no ranking)
    needs_logp: bool = False  # reads logp / old_logp (and ref_logp under KL): ω of the loss
    needs_grad_norm: bool = False  # reads G = ‖e_o − p‖ (the learner computes it only then)
    drops_zero_scores: bool = False  # zero-score tokens leave the ranking population
    gmts_like: bool = False  # a GMTS variant (H or G times |ω|)
    # The method a report pairs this one with for its Δ (same scope, denominator, ρ, mode, seed); "" = none.
    compared_with: str = ""
    color: str = ""  # "#rrggbb" in plots and MLflow charts; "" = a palette colour picked by name
    # A method that is not "rank by score, keep the top ρ": it returns the whole Selection (mask, terms).
    select: Callable[[ScoreInputs, Population], Selection] | None = None
    uses_ratio: bool = True  # reads selection.ratio (required then; must be unset otherwise)
    scopes: tuple[str, ...] | None = None  # the populations it supports; None = every scope
    # scope → the rule its authors apply there, and the only one allowed at that scope (a reference's own rule)
    rule_at_scope: dict[str, str] = field(default_factory=dict, hash=False)  # a dict: no part of the hash
    rule_note: str = ""  # what that rule is, for the error that refuses another
    # What a table of methods says (docs/methods.md, reports): family, what it scores, what it changes, where from.
    family: str = ""
    weight: str = ""
    changes: str = ""
    reference: str = ""
    # What ρ counts: the kept share for top-ρ selection; the treated share for the token methods (a report
    # may then show ρ beside the method rather than as a column of kept shares).
    ratio_means: str = KEPT_SHARE
    # What tables, trial names and plots call it ("" = its name in capitals; "All tokens" for a method that
    # neither scores nor selects: sweeps/labels.py).
    display_name: str = ""
    # Its paper's default setting: its point in the method zoo (sweeps' ``zoo``), in sweep axes (scope, ratio, mode,
    # kl_coef, …); {} = the base experiment's settings. One registration puts a new method in the zoo.
    zoo_point: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def keeps_every_token(self) -> bool:
        """Neither scores nor selects (the full-token baseline): no population, no scoring pass, no ρ axis."""
        return self.score is None and self.select is None

    @property
    def ratio_is_kept_share(self) -> bool:
        """ρ is the share of tokens kept (a report's ratio columns); else it is a setting of the method's own."""
        return self.uses_ratio and self.ratio_means == KEPT_SHARE


SELECTION_METHODS: dict[str, SelectionMethod] = {}


def register_selection_method(name: str, **facts: Any):
    """Register ``score(inputs) -> [B, T]`` as selection method ``name`` with its facts (see SelectionMethod);
    a method that chooses its tokens itself passes ``select=...`` and decorates nothing (``None``)."""
    def decorator(score: Callable[[ScoreInputs], torch.Tensor] | None):
        SELECTION_METHODS[name] = SelectionMethod(name=name, score=score, **facts)
        return score

    return decorator

SelectionScope = Literal["group", "response", "micro_batch", "mini_batch", "global_micro_batch", "global"]
SCOPES: tuple[str, ...] = SelectionScope.__args__
# Scopes whose population spans every data-parallel rank, and those spanning a whole optimiser step.
CROSS_RANK_SCOPES = ("global_micro_batch", "global")
MINI_BATCH_SCOPES = ("mini_batch", "global")
# What the two loss conventions divide the policy-gradient term by (the ablation table's column).
DENOMINATORS = {"advantage": "all", "loss": "selected"}

# ρ·n is computed in floating point (0.2 · 10 = 2.0000000000000004); rounding before the ceiling
# keeps ⌈ρ·n⌉ exact for every ratio written with up to 9 decimals.
_RATIO_DECIMALS = 9
# Fields a recipe fixes (ratio, mode and seed stay free: a sweep varies them).
RECIPE_FIELDS = ("method", "scope", "rule", "apply_to", "omega_aggregation_weight")


class SelectionConfig(BaseModel):
    """How to choose the tokens that carry the policy gradient."""

    model_config = ConfigDict(extra="forbid")

    recipe: str | None = Field(  # first: the fields below are checked against it
        None, description="A named published convention (workers.learner.recipes.RECIPES, listed in docs/methods.md) "
        "that fixes method, scope, rule, apply_to and omega_aggregation_weight; None = set them yourself."
    )
    method: Registered(SELECTION_METHODS, "selection method") = Field(  # type: ignore[valid-type]
        "none", description="A registered selection method (register_selection_method; docs/methods.md lists them "
        "with what each scores and changes).")
    ratio: float | None = Field(
        None, gt=0.0, le=1.0, description="ρ: fraction of eligible tokens kept; for clip_cov/kl_cov the fraction "
        "detached/penalised, for archer the high-entropy share; required unless the method has no ratio "
        "(none, entropy_adv)."
    )
    mode: Literal["top", "bottom"] = Field("top", description="Keep the highest- or the lowest-scored tokens.")
    scope: SelectionScope = Field(
        "group", description="Ranking population: each prompt group; each response (Archer); one micro-batch on "
        "this rank; one optimiser step's mini-batch on this rank; one micro-batch on every rank (TRL); one "
        "mini-batch on every rank."
    )
    rule: Literal["count", "quantile"] = Field(
        "count", description="'count': exactly ⌈ρ·n⌉ tokens, ties broken by a seeded random order; 'quantile': "
        "score ≥ the linear (1 − ρ)-quantile, ties kept (TRL). archer at scope 'response' always uses its "
        "authors' rule: strictly above each response's linear (1 − ρ)-quantile."
    )
    apply_to: Literal["advantage", "loss"] = Field(
        "advantage",
        description=(
            "Denominator of the policy-gradient term. 'advantage': unselected tokens lose their policy-gradient "
            "term, every denominator counts all response tokens (GMTS release, TRL); 'loss': the policy-gradient "
            "term is aggregated over the selected tokens only ('80/20' code, the paper's Eq. 2). Either way the KL "
            "and entropy-bonus terms cover every response token."
        ),
    )
    omega_aggregation_weight: bool = Field(
        True,
        description="Include the loss-aggregation weight in ω (exact gradient); False = the GMTS release's verl "
        "fork (its single-GPU framework pre-divides A and KL by G·|o_i|, i.e. True).",
    )
    seed: int = Field(0, description="Seed of the 'random' method's scores and of the tie-break order.")
    covariance: CovarianceConfig = Field(default_factory=CovarianceConfig,
                                         description="clip_cov / kl_cov settings (arXiv 2505.22617).")
    entropy_advantage: EntropyAdvantageConfig = Field(default_factory=EntropyAdvantageConfig,
                                                      description="entropy_adv settings (arXiv 2506.14758).")
    archer: ArcherConfig = Field(default_factory=ArcherConfig, description="archer settings (arXiv 2507.15778).")

    @model_validator(mode="before")
    @classmethod
    def _fill_fields_from_the_recipe(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("recipe") is None:
            return data
        if data["recipe"] not in RECIPES:
            return data  # the recipe field's own validator names it
        return {**RECIPES[data["recipe"]].fields, **data}  # a field given beside it is checked below

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, recipe: str | None) -> str | None:
        if recipe is not None and recipe not in RECIPES:
            raise ValueError(f"unknown recipe {recipe!r}; known: {sorted(RECIPES)}")
        return recipe

    @field_validator("scope", mode="before")
    @classmethod
    def _old_scope_name(cls, scope: Any) -> Any:
        if scope == "batch":
            raise ValueError(
                "'batch' was renamed because it ranked one micro-batch: use 'micro_batch' for that, "
                "'mini_batch' for one optimiser step on this rank, 'global_micro_batch' or 'global' across ranks"
            )
        return scope

    @field_validator(*RECIPE_FIELDS)
    @classmethod
    def _recipe_fixes_it(cls, value: Any, info: ValidationInfo) -> Any:
        recipe = info.data.get("recipe")
        if recipe is not None:
            fixed = recipe_fields(recipe)[info.field_name]
            if value != fixed:
                raise ValueError(f"recipe {recipe!r} fixes {info.field_name}={fixed!r}, got {value!r} "
                                 "(drop the recipe, e.g. --set selection.recipe=null, to vary it)")
        return value

    @model_validator(mode="after")
    def _ratio_matches_method(self) -> SelectionConfig:
        method = SELECTION_METHODS[self.method]
        if not method.uses_ratio:
            if self.ratio not in (None, 1.0):
                raise ValueError(f"ratio: method {self.method!r} has no ratio; got ratio={self.ratio} "
                                 "(leave it unset, or null: --set selection.ratio=null)")
        elif self.ratio is None:
            raise ValueError(f"ratio: method {self.method!r} needs a ratio in (0, 1]")
        if method.scopes is not None and self.scope not in method.scopes:
            raise ValueError(f"scope: method {self.method!r} supports scope {list(method.scopes)}, got {self.scope!r}")
        forced = method.rule_at_scope.get(self.scope)
        if forced is not None:
            if "rule" in self.model_fields_set and self.rule != forced:
                raise ValueError(f"rule: {self.method} at scope {self.scope!r} is its authors' rule ({method.rule_note}); "
                                 f"leave rule unset or {forced!r}, got {self.rule!r}")
            # Recorded as what runs, so that a dumped config (a sweep trial's, a checkpoint's) validates again.
            self.rule = forced
        return self

    @property
    def keep_ratio(self) -> float:
        return 1.0 if self.ratio is None else self.ratio

    @property
    def denominator(self) -> str:
        """'all' or 'selected': the tokens the policy-gradient term is normalised over."""
        return DENOMINATORS[self.apply_to]

    @property
    def label(self) -> str:
        """The name a table shows: the recipe, else the method."""
        return self.recipe or self.method


@dataclass(frozen=True)
class Selection:
    mask: torch.Tensor  # bool [B, T]: selected tokens (always inside the response mask)
    scores: torch.Tensor  # float [B, T]: the ranking score, 0 off the response mask
    eligible: torch.Tensor  # bool [B, T]: the ranking population
    # The token methods (clip_cov, kl_cov, archer): the tokens they single out (detached, penalised, high-entropy).
    treated: torch.Tensor | None = None
    terms: TokenTerms | None = None  # per-token loss settings the loss and ω read (None: the config's)

    def loss_masks(self, apply_to: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(pg_mask, loss_mask) for :func:`workers.learner.losses.ppo_clip_loss`."""
        if apply_to == "advantage":
            return self.mask.float(), None
        return None, self.mask.float()

    def rows(self, start: int, stop: int, width: int) -> Selection:
        """Rows [start, stop) cut to ``width`` columns (a micro-batch's part of a mini-batch selection)."""
        cut = lambda t: None if t is None else t[start:stop, :width]
        return Selection(mask=cut(self.mask), scores=cut(self.scores), eligible=cut(self.eligible),
                         treated=cut(self.treated), terms=None if self.terms is None else self.terms.rows(start, stop, width))


def select_tokens(
    *,
    response_mask: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    group_ids: torch.Tensor,
    config: SelectionConfig,
    loss_config: PolicyLossConfig | None = None,
    logp: torch.Tensor | None = None,
    old_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    grad_norm: torch.Tensor | None = None,
    process_group: dist.ProcessGroup | None = None,
    generator: torch.Generator | None = None,
    tie_seed: int | None = None,
) -> Selection:
    """Select the tokens that keep the policy gradient among the given population.

    All per-token tensors are [B, T]; ``advantages`` may also be per sequence [B]; ``group_ids``
    [B] names each row's prompt. ``logp``/``old_logp`` (and ``ref_logp`` when the loss has KL) are
    needed by the gmts methods, ``grad_norm`` (G, from ``token_stats_from_logits``) by
    ``gmts_exact``. ``process_group`` is used by the ``global*`` scopes (default: the world group
    when torch.distributed is initialised, else this process alone). ``generator`` draws the
    'random' method's scores; ``tie_seed`` (default ``config.seed``) the tie-break order — it must
    be the same on every rank for the ``global*`` scopes.
    """
    mask = response_mask.bool()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(mask)
    _check_shapes(mask, group_ids, entropy=entropy, advantages=advantages, logp=logp, old_logp=old_logp,
                  ref_logp=ref_logp, grad_norm=grad_norm)
    loss_config = loss_config or PolicyLossConfig()

    method = SELECTION_METHODS[config.method]
    if method.score is None and method.select is None:
        return Selection(mask=mask.clone(), scores=mask.float(), eligible=mask.clone())

    if method.needs_logp:
        if logp is None or old_logp is None:
            raise ValueError(f"method {config.method!r} needs logp and old_logp (ω uses the ratio π/π_old)")
        if loss_config.kl_coef > 0 and ref_logp is None:
            raise ValueError(f"method {config.method!r} with kl_coef > 0 needs ref_logp (ω includes the KL term)")
    if method.needs_grad_norm and grad_norm is None:
        raise ValueError(f"method {config.method!r} needs grad_norm (token_stats_from_logits(..., with_grad_norm=True))")
    inputs = ScoreInputs(config, loss_config, mask, entropy, advantages, logp, old_logp, ref_logp, grad_norm, generator,
                         group_ids)
    tie_break = torch.Generator().manual_seed(config.seed if tie_seed is None else tie_seed)
    if method.select is not None:
        return method.select(inputs, Population(process_group, config.scope in CROSS_RANK_SCOPES, tie_break))
    scores = method.score(inputs)
    scores = torch.where(mask, scores.float(), torch.zeros_like(scores, dtype=torch.float32))
    eligible = mask & (scores > 0) if method.drops_zero_scores else mask.clone()
    selected = _keep_best(scores, eligible, group_ids, config, process_group, tie_break)
    return Selection(mask=selected, scores=scores, eligible=eligible)


def _keep_best(scores: torch.Tensor, eligible: torch.Tensor, group_ids: torch.Tensor, config: SelectionConfig,
               process_group: dist.ProcessGroup | None, tie_break: torch.Generator) -> torch.Tensor:
    """Bool [B, T]: the eligible tokens ranked best within their population, by ``config.rule`` and ``scope``."""
    positions = eligible.flatten().nonzero().squeeze(-1)
    flat_scores = scores.flatten()[positions]
    if config.scope == "group":
        keys = group_ids.to(positions.device).repeat_interleave(eligible.shape[1])[positions]
    elif config.scope == "response":
        keys = positions // eligible.shape[1]  # the row
    else:
        keys = torch.zeros_like(positions)

    if config.scope in CROSS_RANK_SCOPES and _world_size(process_group) > 1:
        keep = _keep_global(flat_scores, config, process_group, tie_break)
    else:
        keep = _keep_per_population(flat_scores, keys, config, tie_break)

    selected = torch.zeros(eligible.numel(), dtype=torch.bool, device=eligible.device)
    selected[positions[keep]] = True
    return selected.view_as(eligible)


# The zoo point of the top-ρ scores: the 80/20 and GMTS papers' headline ρ = 0.2, ranked within each prompt group
# (the GMTS release's population), so that the score is the only difference between them.
TOP_FIFTH_PER_GROUP = {"scope": "group", "ratio": 0.2, "mode": "top"}


register_selection_method(  # the full-token baseline: every response token kept
    "none", uses_ratio=False, ratio_means="", family="baseline", weight="—", changes="nothing: every response token",
    reference="GRPO / DAPO", color="#666666")(None)


@register_selection_method("ets", family="top-ρ selection", weight="H_t", changes="policy-gradient mask",
                           reference="Beyond the 80/20 Rule, arXiv 2506.01939", color="#1f77b4",
                           zoo_point=TOP_FIFTH_PER_GROUP)
def entropy_scores(x: ScoreInputs) -> torch.Tensor:
    """H_t, the token entropy (the "80/20" paper)."""
    return x.entropy.detach()


@register_selection_method("random", family="top-ρ selection", weight="U(0, 1)", changes="policy-gradient mask",
                           reference="control: any ρ-subset", color="#2ca02c",
                           zoo_point=TOP_FIFTH_PER_GROUP)
def random_scores(x: ScoreInputs) -> torch.Tensor:
    """Uniform scores from a seeded generator: the "any ρ-subset" control."""
    generator = x.generator if x.generator is not None else torch.Generator().manual_seed(x.config.seed)
    return torch.rand(x.mask.shape, generator=generator).to(x.mask.device)


def _abs_omega(x: ScoreInputs) -> torch.Tensor:
    omega = effective_grad_coef(x.logp.detach(), x.old_logp, x.advantages, x.mask.float(), x.loss_config, x.ref_logp,
                                include_aggregation_weight=x.config.omega_aggregation_weight)
    return omega.abs()


@register_selection_method("gmts", needs_logp=True, drops_zero_scores=True, gmts_like=True, compared_with="ets",
                           family="top-ρ selection", weight="H_t·|ω_t|", changes="policy-gradient mask",
                           reference="the GMTS paper", color="#d62728",
                           zoo_point=TOP_FIFTH_PER_GROUP)
def gmts_scores(x: ScoreInputs) -> torch.Tensor:
    """H_t · |ω_t| (the GMTS paper)."""
    return x.entropy.detach() * _abs_omega(x)


@register_selection_method("gmts_exact", needs_logp=True, needs_grad_norm=True, drops_zero_scores=True,
                           gmts_like=True, compared_with="ets", family="top-ρ selection",
                           weight="G_t·|ω_t|, G_t = ‖e_o − p‖", changes="policy-gradient mask",
                           reference="the GMTS paper (exact norm, this lab)", color="#ff7f0e",
                           zoo_point=TOP_FIFTH_PER_GROUP)
def gmts_exact_scores(x: ScoreInputs) -> torch.Tensor:
    """G_t · |ω_t|: the ℓ2 norm of the token's loss gradient w.r.t. its logits."""
    return x.grad_norm.detach() * _abs_omega(x)


@register_selection_method("h_abs_adv", drops_zero_scores=True, gmts_like=True, compared_with="ets",
                           family="top-ρ selection", weight="H_t·|A_t|", changes="policy-gradient mask",
                           reference="GMTS on-policy (r = 1, no KL), this lab",
                           zoo_point=TOP_FIFTH_PER_GROUP)
def entropy_times_abs_advantage_scores(x: ScoreInputs) -> torch.Tensor:
    """H_t · |A_t|: GMTS's score when r = 1 and there is no KL (one answer's tokens rank by entropy alone)."""
    return x.entropy.detach() * x.advantages.abs()


@register_selection_method("abs_omega", needs_logp=True, drops_zero_scores=True, gmts_like=True,
                           compared_with="ets", family="top-ρ selection", weight="|ω_t|",
                           changes="policy-gradient mask", reference="GMTS without entropy, this lab",
                           zoo_point=TOP_FIFTH_PER_GROUP)
def abs_omega_scores(x: ScoreInputs) -> torch.Tensor:
    """|ω_t| alone: GMTS without its entropy factor."""
    return _abs_omega(x)


@register_selection_method("g_norm", needs_grad_norm=True, compared_with="ets", family="top-ρ selection",
                           weight="G_t = ‖e_o − p‖", changes="policy-gradient mask",
                           reference="GMTS-exact without ω, this lab", display_name="G-norm",
                           zoo_point=TOP_FIFTH_PER_GROUP)
def gradient_norm_scores(x: ScoreInputs) -> torch.Tensor:
    """G_t alone, the exact norm of the token's log-prob gradient w.r.t. its logits: what entropy stands in for in
    the GMTS paper's H·|ω|, ranked as ETS ranks entropy (no advantage, ratio or KL)."""
    return x.grad_norm.detach()


# ------------------------------------------------------------------- methods that treat tokens (token_methods.py)
COVARIANCE_SCOPES = ("micro_batch", "mini_batch", "global_micro_batch", "global")


def _covariance(x: ScoreInputs, population: Population) -> torch.Tensor:
    return token_covariance(x.logp, x.advantages, x.mask, population.process_group, population.cross_rank)


def _clip_cov(x: ScoreInputs, population: Population) -> Selection:
    covariance = _covariance(x, population)
    terms = _clip_cov_terms(x)
    clipped = clip_masks(x.logp.detach(), x.old_logp, x.advantages, x.loss_config, terms).clipped
    # One draw on every rank for a cross-rank population; this rank's own stream otherwise (verl: torch.randperm).
    generator = population.tie_break if population.cross_rank else (
        x.generator if x.generator is not None else torch.Generator().manual_seed(x.config.seed))
    detached = clip_cov_detached(covariance=covariance, clipped=clipped, response_mask=x.mask, ratio=x.config.ratio,
                                 lower=x.config.covariance.clip_lower, upper=x.config.covariance.clip_upper,
                                 generator=generator, process_group=population.process_group,
                                 cross_rank=population.cross_rank)
    return Selection(mask=x.mask & ~detached, scores=covariance.float(), eligible=x.mask.clone(), treated=detached,
                     terms=terms)


def _clip_cov_terms(x: ScoreInputs) -> TokenTerms | None:
    """Clip-Cov's own ratio clip on every token (the authors' scripts: ε = 1), or None for the loss's."""
    eps = x.config.covariance.ratio_clip
    if eps is None:
        return None
    clip = torch.full(x.mask.shape, eps, dtype=x.logp.dtype, device=x.mask.device)
    return TokenTerms(clip_low=clip, clip_high=clip.clone())


def _kl_cov(x: ScoreInputs, population: Population) -> Selection:
    covariance = _covariance(x, population)
    penalised = kl_cov_penalised(covariance=covariance, response_mask=x.mask, ratio=x.config.ratio,
                                 process_group=population.process_group, cross_rank=population.cross_rank)
    coef = penalised.to(x.logp.dtype) * x.config.covariance.kl_coef
    return Selection(mask=x.mask.clone(), scores=covariance.float(), eligible=x.mask.clone(), treated=penalised,
                     terms=TokenTerms(abs_log_ratio_coef=coef, unclipped=True))


def _entropy_adv(x: ScoreInputs, population: Population) -> Selection:
    shaped = entropy_shaped_advantages(x.advantages, x.entropy, x.mask, x.config.entropy_advantage)
    bonus = torch.where(x.mask, shaped - x.advantages, torch.zeros_like(shaped))
    return Selection(mask=x.mask.clone(), scores=bonus.float(), eligible=x.mask.clone(),
                     terms=TokenTerms(advantages=shaped))


def _archer(x: ScoreInputs, population: Population) -> Selection:
    scores = torch.where(x.mask, x.entropy.detach().float(), torch.zeros_like(x.entropy, dtype=torch.float32))
    if x.config.scope == "response":
        high = high_entropy_per_response(x.entropy, x.mask, x.config.ratio)  # the authors' own rule, exactly
    else:
        high = _keep_best(scores, x.mask, x.group_ids, x.config, population.process_group, population.tie_break)
    terms = archer_terms(high, x.loss_config, x.config.archer, dtype=x.entropy.dtype)
    return Selection(mask=x.mask.clone(), scores=scores, eligible=x.mask.clone(), treated=high, terms=terms)


register_selection_method(
    "clip_cov", select=_clip_cov, display_name="Clip-Cov", needs_logp=True, scopes=COVARIANCE_SCOPES,
    family="covariance",
    ratio_means="share of the population's tokens detached (at most)",
    weight="Cov_t = (A_t − Ā)(log π_t − mean log π)",
    changes="detaches a random ρ of the unclipped tokens with lower < Cov_t < upper",
    reference="Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617 (verl clip_cov)",
    zoo_point={"scope": "micro_batch", "ratio": 0.0002, "kl_coef": 0.0})(None)
register_selection_method(
    "kl_cov", select=_kl_cov, display_name="KL-Cov", needs_logp=True, scopes=COVARIANCE_SCOPES,
    family="covariance",
    ratio_means="share of the population's tokens penalised",
    weight="Cov_t", changes="adds c·|log π − log π_old| to the top ρ by Cov_t; no ratio clip",
    reference="Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617 (verl kl_cov)",
    zoo_point={"scope": "micro_batch", "ratio": 0.002, "kl_coef": 0.0})(None)
register_selection_method(
    "entropy_adv", select=_entropy_adv, display_name="Entropy-adv", uses_ratio=False, ratio_means="",
    family="advantage shaping",
    weight="min(α·H_t, |A_t|/κ)", changes="advantage A_t + min(α·H_t, |A_t|/κ); no mask",
    reference="Reasoning with Exploration: An Entropy Perspective, arXiv 2506.14758")(None)
register_selection_method(
    "archer", select=_archer, display_name="Archer",
    rule_at_scope={"response": "quantile"}, rule_note="strictly above each response's (1 − ρ)-quantile",
    ratio_means="share of tokens given the high-entropy constraints",
    family="dual-token constraints", weight="H_t (top ρ = high-entropy)",
    changes="per-token clip range and KL weight; no mask",
    reference="Stabilizing Knowledge, Promoting Reasoning, arXiv 2507.15778",
    zoo_point={"scope": "response", "ratio": 0.2, "kl_coef": 0.001})(None)


def keep_count(n: torch.Tensor, ratio: float) -> torch.Tensor:
    """⌈ρ·n⌉ for a tensor of population sizes, exact for ratios with up to 9 decimals."""
    return torch.ceil(torch.round(n.double() * ratio, decimals=_RATIO_DECIMALS)).long()


def _keep_per_population(scores: torch.Tensor, keys: torch.Tensor, config: SelectionConfig,
                         tie_break: torch.Generator) -> torch.Tensor:
    """Boolean [n]: the kept entries of each population key k, by ``config.rule``."""
    if scores.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=scores.device)
    if config.rule == "quantile":
        return _keep_above_quantile(scores, keys, config.keep_ratio, config.mode)
    return _keep_best_count(scores, keys, config.keep_ratio, config.mode, tie_break)


def _keep_best_count(scores: torch.Tensor, keys: torch.Tensor, ratio: float, mode: str,
                     tie_break: torch.Generator) -> torch.Tensor:
    """The ⌈ρ·n_k⌉ best-ranked entries of each population k.

    Entries are ordered by score (descending for 'top'); equal scores in a seeded random order:
    a random permutation first, then two stable sorts (by score, then by population).
    """
    shuffle = torch.randperm(scores.numel(), generator=tie_break).to(scores.device)
    by_score = shuffle[torch.argsort(-scores[shuffle] if mode == "top" else scores[shuffle], stable=True)]
    order = by_score[torch.argsort(keys[by_score], stable=True)]
    sorted_keys = keys[order]
    _, inverse, counts = torch.unique_consecutive(sorted_keys, return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    rank_in_population = torch.arange(scores.numel(), device=scores.device) - starts[inverse]
    keep_sorted = rank_in_population < keep_count(counts, ratio)[inverse]
    keep = torch.zeros_like(keep_sorted)
    keep[order] = keep_sorted
    return keep


def _keep_above_quantile(scores: torch.Tensor, keys: torch.Tensor, ratio: float, mode: str) -> torch.Tensor:
    """Entries at or beyond the population's linear-interpolated quantile (TRL: ``torch.quantile``), ties kept."""
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for key in keys.unique():
        members = keys == key
        values = scores[members].float()  # float32, as TRL computes its threshold
        if mode == "top":
            keep[members] = values >= torch.quantile(values, 1.0 - ratio)
        else:
            keep[members] = values <= torch.quantile(values, ratio)
    return keep


def _world_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def _keep_global(scores: torch.Tensor, config: SelectionConfig, group: dist.ProcessGroup | None,
                 tie_break: torch.Generator) -> torch.Tensor:
    """Exact cross-rank selection: gather every rank's eligible scores (rank order), rank them all as one
    population (the same tie-break draw on every rank), and keep this rank's share."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    device = scores.device  # NCCL needs CUDA tensors, gloo takes CPU ones: stay where the scores are
    count = torch.tensor([scores.numel()], dtype=torch.long, device=device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    sizes = [int(c) for c in counts]
    padded = torch.zeros(max(sizes), dtype=torch.float32, device=device)
    padded[: scores.numel()] = scores.detach().float()
    gathered = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    everything = torch.cat([g[:n] for g, n in zip(gathered, sizes)])
    keep_all = _keep_per_population(everything, torch.zeros(everything.numel(), dtype=torch.long, device=device),
                                    config, tie_break)
    offset = sum(sizes[:rank])
    return keep_all[offset : offset + scores.numel()]


def _check_shapes(mask: torch.Tensor, group_ids: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(mask.shape)}")
    for name, tensor in tensors.items():
        if tensor is not None and tensor.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(mask.shape)} like response_mask")
    if group_ids.shape != mask.shape[:1]:
        raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, expected ({mask.shape[0]},): one id per row")
