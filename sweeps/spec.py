"""Sweep specs: a base experiment plus grid axes, expanded into validated trial configs.

The same models are the body of ``POST /v1/sweeps``. Every trial's full ExperimentConfig is
validated while expanding, so a bad spec fails before anything starts, naming the field.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.config import NAME_PATTERN, ExperimentConfig
from orchestrator.config_loader import ConfigError, apply_overrides, read_config_dict, validate
from workers.learner.methods import zoo_points
from workers.learner.recipes import RECIPES, recipe_fields
from workers.learner.selection import DENOMINATORS, SELECTION_METHODS, SelectionScope

SPEC_PACKAGE = "sweeps.specs"

# Grid axis → the config field it sets (model_size picks the experiment preset instead; method may
# also name a reference recipe, see _selection_overrides; denominator sets selection.apply_to).
AXIS_FIELDS: dict[str, str] = {
    "ratio": "selection.ratio",
    "mode": "selection.mode",
    "scope": "selection.scope",
    "algorithm": "algorithm.name",
    "seed": "training.seed",
    "lr": "learner.lr",
    "kl_coef": "algorithm.loss.kl_coef",
}
AXES = ("method", "scope", "denominator", "ratio", "mode", "model_size", "algorithm", "lr", "kl_coef", "seed")
# The full-token baseline selects nothing: these axes do not apply to it (one trial, not one per value).
SELECTION_ONLY_AXES = ("ratio", "mode", "scope", "denominator")
APPLY_TO_OF_DENOMINATOR = {denominator: apply_to for apply_to, denominator in DENOMINATORS.items()}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _axis(items: dict[str, Any] | None = None):
    """The JSON schema of a grid axis says what the validators below accept (so that a client, and
    schemathesis, can tell a valid request from a refused one): at least one value, each value as
    ``items`` says. The checks themselves stay in the validators, whose messages name the value."""

    def extra(schema: dict[str, Any]) -> None:
        for option in schema.get("anyOf", [schema]):
            if option.get("type") == "array":
                option["minItems"] = 1
                option.setdefault("items", {}).update(items or {})

    return extra


# The upper bounds api/limits.py enforces on these fields, stated in the schema too.
SEED_ITEMS = {"minimum": 0, "maximum": 2**32 - 1}


class BaseExperiment(_Strict):
    preset: str = Field(min_length=1, max_length=4096,
                        description="Experiment preset name (e.g. cpu-tiny-s) or absolute YAML path under the "
                        "server's allowed roots, that every trial starts from.")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Dotted config keys → values applied to every trial (like --set)."
    )


class GridAxes(_Strict):
    method: list[str] | None = Field(
        None, json_schema_extra=_axis({"enum": [*SELECTION_METHODS, *sorted(RECIPES)]}), description=f"Selection methods (registered: {', '.join(SELECTION_METHODS)}) or reference recipes "
        f"({', '.join(RECIPES)}).")
    scope: list[SelectionScope] | None = Field(None, json_schema_extra=_axis(), description="Ranking populations (not with a recipe, which fixes it).")
    denominator: list[Literal["all", "selected"]] | None = Field(
        None, json_schema_extra=_axis(), description="What the policy-gradient term is normalised by: all response tokens "
        "(apply_to=advantage) or the selected ones (apply_to=loss); not with a recipe.")
    ratio: list[float] | None = Field(None, json_schema_extra=_axis({"exclusiveMinimum": 0, "maximum": 1}))
    mode: list[Literal["top", "bottom"]] | None = Field(None, json_schema_extra=_axis())
    model_size: list[str] | None = Field(None, json_schema_extra=_axis({"minLength": 1}),
                                         description="Experiment preset names, one per model size.")
    algorithm: list[Literal["grpo", "dapo"]] | None = Field(None, json_schema_extra=_axis())
    seed: list[int] | None = Field(None, json_schema_extra=_axis(SEED_ITEMS))
    lr: list[float] | None = Field(None, json_schema_extra=_axis({"exclusiveMinimum": 0}), description="Learner learning rates, for every method without its own list.")
    kl_coef: list[float] | None = Field(
        None, json_schema_extra=_axis({"minimum": 0}),
        description="β of the KL(π‖π_ref) term (algorithm.loss.kl_coef), e.g. each zoo arm at its paper's β in "
        "`trials`. The ablation report does not tell trials apart by β, so two points that differ only in β "
        "are refused.")
    lr_by_method: dict[str, list[float]] | None = Field(
        None, json_schema_extra=lambda schema: [
            option.update(additionalProperties={"type": "array", "minItems": 1,
                                                "items": {"type": "number", "exclusiveMinimum": 0}})
            for option in schema["anyOf"] if option.get("type") == "object"],
        description="Method → its own lr list (arms compared each at the lr that suits it; the report "
        "chooses each arm's lr on a validation set). Methods not listed use `lr` (or the preset's).")

    @field_validator("lr")
    @classmethod
    def _lrs_positive(cls, lrs: list[float] | None) -> list[float] | None:
        for index, lr in enumerate(lrs or []):
            if lr <= 0:
                raise ValueError(f"lr[{index}]={lr} must be > 0")
        return lrs

    @field_validator("lr_by_method")
    @classmethod
    def _method_lrs_positive(cls, by_method: dict[str, list[float]] | None) -> dict[str, list[float]] | None:
        for method, lrs in (by_method or {}).items():
            if not lrs:
                raise ValueError(f"{method}: give at least one lr (or leave the method out)")
            for index, lr in enumerate(lrs):
                if lr <= 0:
                    raise ValueError(f"{method}[{index}]={lr} must be > 0")
        return by_method

    @field_validator("kl_coef")
    @classmethod
    def _kl_coefs_not_negative(cls, coefs: list[float] | None) -> list[float] | None:
        for index, coef in enumerate(coefs or []):
            if coef < 0:
                raise ValueError(f"kl_coef[{index}]={coef} must be ≥ 0")
        return coefs

    @field_validator("method")
    @classmethod
    def _known_methods(cls, methods: list[str] | None) -> list[str] | None:
        known = list(SELECTION_METHODS) + sorted(RECIPES)
        for index, method in enumerate(methods or []):
            if method not in known:
                raise ValueError(f"method[{index}]={method!r} is neither a method nor a recipe; known: {known}")
        return methods

    @field_validator("ratio")
    @classmethod
    def _ratios_in_range(cls, ratios: list[float] | None) -> list[float] | None:
        for index, ratio in enumerate(ratios or []):
            if not 0.0 < ratio <= 1.0:
                raise ValueError(f"ratio[{index}]={ratio} must be in (0, 1]")
        return ratios

    @field_validator("*")
    @classmethod
    def _non_empty(cls, values: list | None) -> list | None:
        if values is not None and len(values) == 0:
            raise ValueError("an axis needs at least one value (or leave it out)")
        return values


class SweepSpec(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    base: BaseExperiment
    grid: GridAxes = Field(default_factory=GridAxes)
    trials: list[dict[str, Any]] = Field(default_factory=list, description="Extra explicit grid points.",
                                         json_schema_extra={"items": {"type": "object", "propertyNames": {"enum": list(AXES)}}})
    zoo: dict[str, Any] | None = Field(
        None, description="The method zoo: one point per registered method and per recipe with a zoo point, each at "
        "its paper's default setting (the registry's zoo_point), with these axis values too (e.g. {seed: 0}); "
        "added to the grid's and the trials' points. A method registered later joins it with no spec edit.",
        json_schema_extra={"propertyNames": {"enum": list(AXES)}})
    exclude: list[dict[str, Any]] = Field(default_factory=list, description="Grid points matching all keys are dropped.",
                                          json_schema_extra={"items": {"type": "object", "propertyNames": {"enum": list(AXES)}}})
    # Upper bounds: api/limits.py's, stated here for the schema (the service enforces them).
    max_concurrent_trials: int = Field(1, ge=1, json_schema_extra={"maximum": 1024})
    max_failures: int = Field(2, ge=0, json_schema_extra={"maximum": 100},
                              description="Restarts of a crashed trial (from its last checkpoint).")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI; None = $MLFLOW_TRACKING_URI or runs/mlflow.db.")
    experiment: str = Field("gmts-lab", pattern=NAME_PATTERN,
                            description="MLflow experiment of the parent and child runs (letters, digits, '.', '_', '-').")
    lr_source: str = Field("", max_length=300, pattern=r"^[^\n\r]*$",
                           description="Where the lrs the spec fixes come from (the benchmark or paper that chose "
                           "them), one line; the report's header cites it beside the lrs (a sweep that runs one lr "
                           "per arm chooses nothing itself).")

    @model_validator(mode="after")
    def _points_use_known_axes(self) -> SweepSpec:
        named = [(f"{field}[{index}]", point) for field in ("trials", "exclude")
                 for index, point in enumerate(getattr(self, field))]
        for where, point in named + ([("zoo", self.zoo)] if self.zoo is not None else []):
            unknown = set(point) - set(AXES)
            if unknown:
                raise ValueError(f"{where}: unknown axis {sorted(unknown)}; axes are {list(AXES)}")
        if self.zoo is not None and "method" in self.zoo:
            raise ValueError("zoo: 'method' comes from the registry (one point per method); set the other axes")
        return self

    def spec_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:12]


class Trial(BaseModel):
    name: str
    point: dict[str, Any]  # axis → value, the grid point (MLflow params method, ratio, …)
    config: ExperimentConfig


def grid_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """The grid's points in a stable order, 'none' collapsed over ratio/mode, exclusions applied; a method
    in ``lr_by_method`` runs at each of its own lrs instead of the ``lr`` axis."""
    axes = {axis: values for axis, values in spec.grid.model_dump(exclude={"lr_by_method"}).items()
            if values is not None}
    points: list[dict[str, Any]] = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    by_method = spec.grid.lr_by_method or {}
    if by_method:
        points = [point if point.get("method") not in by_method else {**point, "lr": lr}
                  for point in points for lr in (by_method.get(point.get("method")) or [point.get("lr")])]
    points += [dict(point) for point in spec.trials]
    if spec.zoo is not None:
        points += [{**point, **spec.zoo} for point in zoo_points()]
    unique: list[dict[str, Any]] = []
    for point in points:
        registered = SELECTION_METHODS.get(point.get("method"))
        if registered is not None and registered.keeps_every_token:
            # The full-token baseline has no ratio, mode, scope or denominator: one trial, not one per value.
            point = {k: v for k, v in point.items() if k not in SELECTION_ONLY_AXES}
        elif registered is not None and not registered.uses_ratio:
            point = {k: v for k, v in point.items() if k != "ratio"}  # e.g. entropy_adv: one trial, not one per ρ
        elif point.get("method") in RECIPES:
            # A recipe fixes its scope and denominator: one trial, not one per value of those axes.
            point = {k: v for k, v in point.items() if k not in ("scope", "denominator")}
        if point not in unique and not any(_matches(point, rule) for rule in spec.exclude):
            unique.append(point)
    _one_kl_coef_per_point(unique)
    return unique


def _one_kl_coef_per_point(points: list[dict[str, Any]]) -> None:
    """Refuse points that differ only in β: the ablation report (TrialPoint) would merge their cells."""
    seen: dict[str, Any] = {}
    for point in points:
        rest = json.dumps({k: v for k, v in point.items() if k != "kl_coef"}, sort_keys=True)
        if rest in seen and seen[rest] != point.get("kl_coef"):
            raise ConfigError(f"kl_coef: the point {trial_name(point)} appears again with kl_coef={seen[rest]}; points "
                              "that differ only in β are not told apart by the ablation report: give each one kl_coef")
        seen[rest] = point.get("kl_coef")


def _dotted(overrides: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"training": {"steps": 5}} and {"training.steps": 5} both set one field, never a whole section
    (``--set base.overrides.training.steps=5`` arrives nested)."""
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_dotted(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def _matches(point: dict[str, Any], rule: dict[str, Any]) -> bool:
    return all(point.get(axis) == value for axis, value in rule.items())


def trial_name(point: dict[str, Any]) -> str:
    parts = [f"{axis}={point[axis]}" for axis in AXES if axis in point]
    return ",".join(parts) or "base"


def expand(spec: SweepSpec, output_dir: Path | None = None) -> list[Trial]:
    """Validated trials; raises ConfigError naming the trial and the field at the first bad one."""
    trials: list[Trial] = []
    for index, point in enumerate(grid_points(spec)):
        preset = point.get("model_size", spec.base.preset)
        overrides = [f"{key}={json.dumps(value)}" for key, value in _dotted(spec.base.overrides).items()]
        overrides += _selection_overrides(point)
        overrides += [f"{AXIS_FIELDS[axis]}={json.dumps(value)}" for axis, value in point.items() if axis in AXIS_FIELDS]
        name = f"{spec.name}-t{index:03d}"
        overrides += [f"name={name}", f"tracking.experiment={json.dumps(spec.experiment)}"]
        if output_dir is not None:
            overrides.append(f"output_dir={json.dumps(str(output_dir))}")
        if spec.tracking_uri:
            overrides.append(f"tracking.tracking_uri={json.dumps(spec.tracking_uri)}")
        try:
            data = apply_overrides(read_config_dict(preset), overrides)
        except ConfigError as exc:
            raise ConfigError(f"trial {index} ({trial_name(point)}): {exc}") from None
        config = validate(ExperimentConfig, data, origin=f"trial {index} ({trial_name(point)})")
        trials.append(Trial(name=name, point=point, config=config))
    if not trials:
        raise ConfigError("grid: the spec expands to no trial (every point excluded?)")
    return trials


def _selection_overrides(point: dict[str, Any]) -> list[str]:
    """The method axis: a recipe sets itself and every field it fixes (replacing what the preset says);
    a plain method clears the preset's recipe. The denominator axis sets selection.apply_to."""
    overrides = []
    method = point.get("method")
    if method in RECIPES:
        overrides.append(f"selection.recipe={json.dumps(method)}")
        overrides += [f"selection.{name}={json.dumps(value)}" for name, value in recipe_fields(method).items()]
    elif method is not None:
        overrides += ["selection.recipe=null", f"selection.method={json.dumps(method)}"]
    if method in SELECTION_METHODS and not SELECTION_METHODS[method].uses_ratio:
        overrides.append("selection.ratio=null")  # none, entropy_adv: no ratio, whatever the preset holds
    if "denominator" in point:
        overrides.append(f"selection.apply_to={json.dumps(APPLY_TO_OF_DENOMINATOR[point['denominator']])}")
    return overrides


def spec_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(SPEC_PACKAGE).iterdir() if p.name.endswith(".yaml"))


def load_spec(source: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    """A shipped spec name or a YAML path, with optional ``--set`` overrides of the spec itself."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"spec: no such file {str(source)!r}")
        text, origin = path.read_text(), str(path)
    else:
        shipped = resources.files(SPEC_PACKAGE) / f"{source}.yaml"
        if not shipped.is_file():
            raise ConfigError(f"spec: {str(source)!r} is neither a file nor a shipped spec; shipped: {', '.join(spec_names())}")
        text, origin = shipped.read_text(), f"spec:{source}"
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping")
    return validate(SweepSpec, apply_overrides(data, overrides or []), origin=origin)
