"""The zoo's specs: every registered token method runs in both, at its paper's default, and nothing else varies."""

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from orchestrator.config import ExperimentConfig
from orchestrator.config_loader import ConfigError
from sweeps.spec import expand, load_spec
from workers.learner.methods import zoo_points
from workers.learner.recipes import RECIPES
from workers.learner.selection import SELECTION_METHODS, SelectionConfig

METHODS_DOC = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def _methods(trials):
    return {t.config.selection.method for t in trials}


def _defaults_table() -> list[tuple[str, str, str, str]]:
    """(method, config path, value, zoo-specs column) of docs/methods.md's "Defaults and their sources"."""
    text = METHODS_DOC.read_text()
    section = text[text.index("## Defaults and their sources"):]
    section = section[: section.index("\n## ", 4)]
    rows = re.findall(r"^\| `(\w+)` \| `([\w.]+)` \| ([^|]+?) \| [^|]+ \| ([^|]+?) \|$", section, re.MULTILINE)
    assert len(rows) >= 15, "the table lost its rows (or this parser its way)"
    return rows


def _value_at(config: BaseModel, path: str):
    value = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _parsed(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def _arms(spec: str) -> dict[str, object]:
    return {t.point["method"]: t.config for t in expand(load_spec(spec))}


def test_cpu_zoo_runs_every_registered_method_once():
    trials = expand(load_spec("cpu-zoo"))
    assert _methods(trials) == set(SELECTION_METHODS)  # a method registered later must join the zoo
    # One trial per registered method and per recipe with a zoo point, built from the registries
    assert [t.point["method"] for t in trials] == [p["method"] for p in zoo_points()]
    assert len(trials) == len(SELECTION_METHODS) + sum(r.zoo_point is not None for r in RECIPES.values())
    assert all(t.point.get("seed") == 0 for t in trials)


def test_every_zoo_trial_config_survives_the_round_trip_tune_gives_it():
    """Tune hands each trial its config as JSON (sweeps/tuner.py) and the trial validates it again: a validator
    that reads ``model_fields_set`` must accept its own dump (Archer at scope 'response' once refused it)."""
    for trial in expand(load_spec("cpu-zoo")):
        again = ExperimentConfig.model_validate(trial.config.model_dump(mode="json"))
        assert again == trial.config, trial.name


@pytest.mark.parametrize("spec", ["cpu-zoo", "paper-zoo"])
def test_zoo_arms_carry_the_published_defaults_docs_methods_lists(spec, request):
    if spec == "paper-zoo":
        request.getfixturevalue("gpu_roots")
    arms = _arms(spec)
    checked = 0
    for method, path, value, in_specs in _defaults_table():
        if in_specs.strip() == "same":
            assert _value_at(arms[method], path) == _parsed(value), f"{spec}: {method} {path}"
            checked += 1
    assert checked >= 15


def test_the_method_configs_defaults_are_the_documented_ones():
    """A bare SelectionConfig carries the published values (the specs set only ratio, scope and β)."""
    for method, path, value, _ in _defaults_table():
        if path.startswith(("selection.covariance.", "selection.entropy_advantage.", "selection.archer.")):
            ratio = None if not SELECTION_METHODS[method].uses_ratio else 0.2
            config = SelectionConfig(method=method, ratio=ratio, scope="micro_batch")
            assert _value_at(config, path.removeprefix("selection.")) == _parsed(value), path


def test_zoo_beta_is_each_papers_and_only_the_covariance_arms_drop_it():
    arms = _arms("cpu-zoo")
    betas = {method: config.algorithm.loss.kl_coef for method, config in arms.items()}
    assert betas.pop("clip_cov") == 0.0 and betas.pop("kl_cov") == 0.0
    assert set(betas.values()) == {0.001}  # the baseline, GMTS/ETS, entropy_adv and Archer
    assert {arms[m].algorithm.loss.kl_estimator for m in arms} == {"low_var_kl"}
    # Apart from β, one loop for every arm: the same loss, steps, learner and rollout.
    for field in ("training", "learner", "rollout"):
        assert len({getattr(c, field).model_dump_json() for c in arms.values()}) == 1, field
    assert len({c.algorithm.model_copy(update={"loss": c.algorithm.loss.model_copy(update={"kl_coef": 0.0})})
                .model_dump_json() for c in arms.values()}) == 1


def test_two_points_differing_only_in_beta_are_refused(write_spec):
    spec = load_spec(write_spec(grid={"method": ["ets"], "ratio": [0.2], "kl_coef": [0.0, 0.001]}))
    with pytest.raises(ConfigError, match="kl_coef"):
        expand(spec)
    one = expand(load_spec(write_spec(grid={"method": ["ets"], "ratio": [0.2], "kl_coef": [0.0]})))
    assert one[0].config.algorithm.loss.kl_coef == 0.0 and one[0].point["kl_coef"] == 0.0


def test_a_negative_beta_axis_names_the_field(write_spec):
    with pytest.raises(ConfigError, match=r"kl_coef"):
        load_spec(write_spec(grid={"method": ["ets"], "ratio": [0.2], "kl_coef": [-0.1]}))


def test_paper_zoo_expands_on_the_gpu_presets(gpu_roots: Path):
    trials = expand(load_spec("paper-zoo"))
    assert _methods(trials) == set(SELECTION_METHODS)
    assert all(t.config.model.path.parent == gpu_roots for t in trials)
    assert all(t.config.resources.gpus_per_learner_actor > 0 for t in trials)


def test_a_method_without_a_ratio_runs_once_whatever_the_ratio_axis(write_spec):
    spec = load_spec(write_spec(grid={"method": ["entropy_adv", "ets"], "ratio": [0.2, 0.5]}))
    trials = expand(spec)
    assert [t.point["method"] for t in trials] == ["entropy_adv", "ets", "ets"]
    assert trials[0].config.selection.ratio is None
