"""The zoo's specs: every registered token method runs in both, at its paper's default, and nothing else varies."""

from pathlib import Path

import pytest

from sweeps.spec import expand, load_spec
from workers.learner.selection import SELECTION_METHODS


def _methods(trials):
    return {t.config.selection.method for t in trials}


def test_cpu_zoo_runs_every_registered_method_once_at_its_default():
    trials = expand(load_spec("cpu-zoo"))
    assert _methods(trials) == set(SELECTION_METHODS)  # a method registered later must join the zoo
    assert len(trials) == 13 and all(t.point.get("seed") == 0 for t in trials)
    by_point = {t.point["method"]: t.config for t in trials}
    assert by_point["clip_cov"].selection.ratio == 0.0002 and by_point["clip_cov"].selection.scope == "micro_batch"
    assert (by_point["clip_cov"].selection.covariance.clip_lower, by_point["clip_cov"].selection.covariance.clip_upper) \
        == (1.0, 5.0)
    assert by_point["kl_cov"].selection.ratio == 0.002 and by_point["kl_cov"].selection.covariance.kl_coef == 1.0
    assert by_point["entropy_adv"].selection.ratio is None
    assert (by_point["entropy_adv"].selection.entropy_advantage.alpha,
            by_point["entropy_adv"].selection.entropy_advantage.kappa) == (0.4, 2.0)
    assert by_point["archer"].selection.archer.high_entropy_clip == 0.5
    # Only the token method differs: the same loss, steps and learner in every trial.
    for field in ("algorithm", "training", "learner", "rollout"):
        assert len({getattr(c, field).model_dump_json() for c in by_point.values()}) == 1, field
    assert {c.algorithm.loss.kl_coef for c in by_point.values()} == {0.001}


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
