"""Sweep specs: bad specs fail before anything starts naming the field; grids expand as documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import ray
from pydantic import ValidationError

from orchestrator.config_loader import ConfigError
from sweeps import run as sweep_cli
from sweeps.spec import SweepSpec, expand, grid_points, load_spec, spec_names

CPU_SPECS = ("cpu-demo", "cpu-ablation")


def test_unknown_grid_axis_is_named(write_spec) -> None:
    path = write_spec(grid={"method": ["ets"], "ratio": [0.2], "temperature": [0.5]})
    with pytest.raises(ConfigError) as excinfo:
        load_spec(path)
    assert "grid.temperature" in str(excinfo.value)


def test_unknown_axis_in_explicit_trials_is_named(write_spec) -> None:
    path = write_spec(trials=[{"method": "ets", "ratio": 0.2, "temperature": 0.5}])
    with pytest.raises(ConfigError) as excinfo:
        load_spec(path)
    assert "trials[0]" in str(excinfo.value) and "temperature" in str(excinfo.value)


def test_ratio_zero_is_named(write_spec) -> None:
    path = write_spec(grid={"method": ["ets"], "ratio": [0.2, 0.0]})
    with pytest.raises(ConfigError) as excinfo:
        load_spec(path)
    message = str(excinfo.value)
    assert "grid.ratio" in message and "ratio[1]=0.0" in message


def test_an_experiment_name_with_shell_text_is_named(write_spec) -> None:
    path = write_spec(experiment="gmts'; $(id)")
    with pytest.raises(ConfigError) as excinfo:
        load_spec(path)
    assert "experiment" in str(excinfo.value) and "pattern" in str(excinfo.value)


def test_method_needing_a_ratio_without_one_names_trial_and_field(write_spec, preset_file: Path) -> None:
    # The base preset has a ratio; an explicit trial through a base whose ratio is removed has none.
    path = write_spec(base={"preset": str(preset_file), "overrides": {"selection.ratio": None}}, grid={"method": ["ets"]})
    spec = load_spec(path)
    with pytest.raises(ConfigError) as excinfo:
        expand(spec)
    message = str(excinfo.value)
    assert "trial 0 (method=ets)" in message
    assert "selection" in message and "ratio: method 'ets' needs a ratio" in message


def test_bad_spec_exits_before_starting_ray_or_mlflow(write_spec, tmp_path: Path, capsys) -> None:
    path = write_spec(grid={"method": ["ets"], "ratio": [0.0]})
    output = tmp_path / "out"
    assert sweep_cli.main([str(path), "--output-dir", str(output)]) == sweep_cli.EXIT_BAD_SPEC
    assert "grid.ratio" in capsys.readouterr().out
    assert not ray.is_initialized()
    assert not output.exists()  # no sweep folder, no MLflow store


def test_none_collapses_ratio_and_mode(write_spec) -> None:
    spec = load_spec(write_spec(grid={"method": ["none", "ets"], "ratio": [0.1, 0.5], "mode": ["top", "bottom"]}))
    points = grid_points(spec)
    assert points[0] == {"method": "none"}
    assert sum(p["method"] == "none" for p in points) == 1
    assert len(points) == 1 + 2 * 2
    trials = expand(spec)
    baseline = trials[0].config.selection
    assert baseline.method == "none" and baseline.ratio is None  # the preset's ratio 0.2 was cleared


def test_exclusions_and_explicit_trials(write_spec) -> None:
    spec = load_spec(
        write_spec(
            grid={"method": ["ets", "gmts"], "ratio": [0.2, 0.5], "seed": [0, 1]},
            exclude=[{"method": "ets", "ratio": 0.5}, {"seed": 1, "ratio": 0.2}],
            trials=[{"method": "random", "ratio": 0.2, "seed": 7}, {"method": "gmts", "ratio": 0.2, "seed": 0}],
        )
    )
    points = grid_points(spec)
    assert points == [
        {"method": "ets", "ratio": 0.2, "seed": 0},
        {"method": "gmts", "ratio": 0.2, "seed": 0},
        {"method": "gmts", "ratio": 0.5, "seed": 0},
        {"method": "gmts", "ratio": 0.5, "seed": 1},
        {"method": "random", "ratio": 0.2, "seed": 7},  # the explicit gmts trial duplicates a grid point
    ]
    trials = expand(spec)
    assert [t.config.training.seed for t in trials] == [0, 0, 0, 1, 7]
    assert trials[4].config.selection.method == "random"
    assert len({t.name for t in trials}) == len(trials)


def test_each_method_runs_at_its_own_lrs(write_spec) -> None:
    spec = load_spec(write_spec(grid={"method": ["none", "ets", "gmts"], "ratio": [0.2], "lr": [1e-4],
                                      "lr_by_method": {"gmts": [3e-5, 3e-4]}}))
    points = grid_points(spec)
    assert [(p["method"], p["lr"]) for p in points] == [("none", 1e-4), ("ets", 1e-4), ("gmts", 3e-5), ("gmts", 3e-4)]
    trials = expand(spec)
    assert [t.config.learner.lr for t in trials] == [1e-4, 1e-4, 3e-5, 3e-4]
    assert trials[3].point == {"method": "gmts", "ratio": 0.2, "lr": 3e-4}
    with pytest.raises(ConfigError, match=r"lr_by_method.*gmts\[0\]=-1"):
        load_spec(write_spec(grid={"method": ["gmts"], "ratio": [0.2], "lr_by_method": {"gmts": [-1]}}))


def test_everything_excluded_is_an_error(write_spec) -> None:
    spec = load_spec(write_spec(grid={"method": ["ets"], "ratio": [0.2]}, exclude=[{"method": "ets"}]))
    with pytest.raises(ConfigError, match="no trial"):
        expand(spec)


def test_nested_set_override_changes_one_field(write_spec) -> None:
    path = write_spec(grid={"method": ["ets"], "ratio": [0.2]})
    spec = load_spec(path, ["base.overrides.training.steps=7", "base.overrides.learner.lr=0.01"])
    config = expand(spec)[0].config
    assert config.training.steps == 7 and config.learner.lr == 0.01
    assert config.learner.mini_batch_size == 16  # the rest of the section is the preset's


@pytest.mark.slow
@pytest.mark.parametrize("name", CPU_SPECS)
def test_shipped_cpu_specs_expand(name: str) -> None:
    assert name in spec_names()
    trials = expand(load_spec(name))
    methods = {t.point["method"] for t in trials}
    assert {"none", "ets-release", "gmts-release"} <= methods  # the GMTS release's recipes
    for trial in trials:  # every ETS/GMTS trial names its convention: a recipe, or a matched-scope pair
        selection = trial.config.selection
        assert selection.recipe is not None or selection.method == "none" or trial.point.get("scope") == "group"


@pytest.mark.slow
def test_cpu_ablation_grid_size() -> None:
    trials = expand(load_spec("cpu-ablation"))
    # (1 baseline + 4 methods × 9 ratios × 2 modes + random × 9 ratios, top only) × 2 sizes × 2 algorithms × 2 seeds
    assert len(trials) == (1 + 4 * 9 * 2 + 9) * 2 * 2 * 2
    pair = {t.config.selection.method: t.config.selection for t in trials if t.point["method"] in ("ets", "gmts")}
    assert pair["ets"].scope == pair["gmts"].scope == "group" and pair["ets"].apply_to == pair["gmts"].apply_to
    assert {(t.point["method"], t.point.get("mode")) for t in trials} >= {("random", "top"), ("ets", "bottom"),
                                                                          ("gmts", "bottom"), ("gmts-release", "bottom")}
    assert not any(t.point["method"] == "random" and t.point.get("mode") == "bottom" for t in trials)
    assert {t.config.model.size_label for t in trials} == {"tiny-s", "tiny-m"}
    assert {t.config.algorithm.name for t in trials} == {"grpo", "dapo"}


GPU_SPECS = {"paper-math": 12, "paper-ratio": 21, "paper-code": 6, "paper-cs": 6}


@pytest.mark.parametrize("name,size", GPU_SPECS.items())
def test_shipped_gpu_specs_expand(name: str, size: int, gpu_roots: Path) -> None:
    trials = expand(load_spec(name))
    assert len(trials) == size
    assert all(t.config.model.path.parent == gpu_roots for t in trials)
    assert all(t.config.resources.gpus_per_learner_actor > 0 for t in trials)


def test_paper_math_grid_covers_both_sizes_and_algorithms(gpu_roots: Path) -> None:
    trials = expand(load_spec("paper-math"))
    points = {(t.config.model.path.name, t.config.algorithm.name, t.config.selection.method) for t in trials}
    assert points == {(m, a, s) for m in ("Qwen2.5-Math-1.5B", "Qwen2.5-Math-7B") for a in ("grpo", "dapo")
                      for s in ("none", "ets", "gmts")}


def test_gpu_spec_without_the_model_root_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GMTS_MODELS_DIR", raising=False)
    with pytest.raises(ConfigError, match=r"(?s)trial 0 .*model\.path"):
        expand(load_spec("paper-math"))


def test_recipe_method_sets_every_field_it_fixes_and_drops_scope_axes(tmp_path) -> None:
    spec = SweepSpec(name="r", base={"preset": "cpu-tiny-s"},
                     grid={"method": ["none", "ets-8020", "ets"], "scope": ["group", "mini_batch"],
                           "denominator": ["all", "selected"], "ratio": [0.2]})
    trials = expand(spec)
    points = [t.point for t in trials]
    # none: one trial; the recipe: one (it fixes scope and denominator); plain ets: 2 scopes × 2 denominators
    assert [p["method"] for p in points] == ["none", "ets-8020"] + ["ets"] * 4
    recipe = trials[1].config.selection
    assert (recipe.recipe, recipe.scope, recipe.apply_to, recipe.label) == ("ets-8020", "micro_batch", "loss", "ets-8020")
    plain = {(t.config.selection.scope, t.config.selection.apply_to) for t in trials[2:]}
    assert plain == {("group", "advantage"), ("group", "loss"), ("mini_batch", "advantage"), ("mini_batch", "loss")}
    assert all(t.config.selection.recipe is None for t in trials[2:])  # the preset's recipe is cleared


def test_unknown_method_or_scope_names_the_axis() -> None:
    with pytest.raises(ValidationError, match="method.*ets-8021"):
        SweepSpec(name="r", base={"preset": "cpu-tiny-s"}, grid={"method": ["ets-8021"]})
    with pytest.raises(ValidationError, match="scope"):
        SweepSpec(name="r", base={"preset": "cpu-tiny-s"}, grid={"scope": ["batch"]})


def test_the_shipped_specs_table_counts_each_specs_trials() -> None:
    """sweeps/README's table of shipped specs states each grid's size; a spec edited without its row
    would mislead whoever plans a sweep's cost from it."""
    readme = (Path(__file__).resolve().parents[2] / "sweeps" / "README.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|[^|]*\| (\d[\d,]*) \|", readme, flags=re.MULTILINE)
    stated = {name: int(count.replace(",", "")) for name, count in rows}
    assert set(stated) == set(spec_names()), stated
    assert {name: len(grid_points(load_spec(name))) for name in stated} == stated


@pytest.mark.parametrize("name", spec_names())
def test_every_shipped_spec_says_where_its_lrs_come_from(name: str) -> None:
    """A report's header cites the spec's lr_source; a shipped spec that compares methods on CPU runs each
    at an lr of its own (``lr_by_method``), never the preset's one lr by default."""
    spec = load_spec(name)
    assert spec.lr_source.strip(), f"{name}: no lr_source"
    compares = spec.base.preset.startswith("cpu-tiny") and name != "cpu-zoo"  # the zoo checks methods run
    if compares:
        methods = {point["method"] for point in grid_points(spec)}
        assert spec.grid.lr_by_method and methods <= set(spec.grid.lr_by_method), (name, methods)
        assert "validation" in spec.lr_source


def test_an_lr_source_is_one_line(write_spec) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_spec(write_spec(lr_source="from a benchmark\n$(id)"))
    assert "lr_source" in str(excinfo.value)
