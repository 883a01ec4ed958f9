"""The real-model benchmark's report: intervals, paired differences and the seed check, from run records.

The runs themselves are SmolLM2 training runs of minutes each (``python -m benchmarks.real_model``, not CI);
their path is the one ``tests/orchestrator/test_train_smollm2.py`` runs, stop by callback included. Here the
records are written by hand, so every figure can be checked against arithmetic done in the test.
"""

from __future__ import annotations

import math

import pytest

from benchmarks.real_model import ARMS, binomial_half_width, run_grid, table
from sweeps.statistics import t_interval


def _record(arm: str, seed: int, accuracy: float, first_reward: float = 0.25, base: float = 0.16) -> dict:
    return {"arm": arm, "seed": seed, "steps": 9, "rl_seconds": 481.0, "wall_seconds": 700.0, "budget_reached": True,
            "median_step_seconds": 52.0, "accuracy": accuracy, "response_length": 9.0, "base_accuracy": base,
            "base_response_length": 17.3, "train_reward": [first_reward, 0.5],
            "first_step": {"train/accuracy": first_reward, "reward/mean": first_reward,
                           "train/response_length": 15.0 + seed}}


def _figures(result: dict) -> dict[str, dict]:
    return {figure["name"]: figure for figure in result["figures"]}


def test_the_arms_are_the_published_conventions_at_twenty_percent():
    assert [arm.name for arm in ARMS] == ["none", "ets-release", "gmts-release"]
    overrides = {arm.name: arm.config_overrides() for arm in ARMS}
    assert "selection.method=none" in overrides["none"] and "selection.ratio=null" in overrides["none"]
    for name in ("ets-release", "gmts-release"):
        assert f"selection.recipe={name}" in overrides[name] and "selection.ratio=0.2" in overrides[name]
        assert "selection.mode=top" in overrides[name]


def test_table_gives_each_arm_its_interval_over_seeds_and_the_paired_differences():
    accuracy = {("none", 0): 0.55, ("none", 1): 0.60, ("ets-release", 0): 0.58, ("ets-release", 1): 0.59,
                ("gmts-release", 0): 0.62, ("gmts-release", 1): 0.66}
    records = [_record(arm, seed, value, first_reward=0.2 + 0.1 * seed) for (arm, seed), value in accuracy.items()]
    figures = _figures(table(records, problems=118, settings={"preset": "cpu-smollm2-arith"}))

    gmts = figures["gmts-release: held-out greedy accuracy after training"]
    expected = t_interval([0.62, 0.66])
    assert gmts["value"] == pytest.approx(0.64)
    assert f"[{expected.low:.3f}, {expected.high:.3f}]" in gmts["detail"]
    assert f"seed 0: 0.620 ± {1.96 * math.sqrt(0.62 * 0.38 / 118):.3f} after 9 steps" in gmts["detail"]
    difference = figures["gmts-release − ets-release: accuracy, paired by seed"]
    assert difference["value"] == pytest.approx(((0.62 - 0.58) + (0.66 - 0.59)) / 2)
    assert "0: +0.040, 1: +0.070" in difference["detail"]
    assert figures["ets-release − none: accuracy, paired by seed"]["value"] == pytest.approx(0.01)
    base = figures["base model held-out greedy accuracy (118 problems)"]
    assert base["value"] == 0.16 and "the same in all 6 runs" in base["detail"]
    assert figures["seed check: first-step rollouts identical across arms within each seed"]["value"] == "True"
    assert figures["seed check: first-step rollouts differ between seeds"]["value"] == "True"


def test_table_says_so_when_runs_disagree_on_what_must_be_equal():
    records = [_record("none", 0, 0.5), _record("gmts-release", 0, 0.6, first_reward=0.3, base=0.2)]
    figures = _figures(table(records, problems=118, settings={}))
    assert figures["base model held-out greedy accuracy (118 problems)"]["value"] is None
    assert figures["seed check: first-step rollouts identical across arms within each seed"]["value"] == "False"
    assert "1 seed" in figures["gmts-release − none: accuracy, paired by seed"]["detail"]
    assert figures["seed check: first-step rollouts differ between seeds"]["value"] == "n/a (one seed)"


def test_binomial_half_width_is_the_normal_interval_over_problems():
    assert binomial_half_width(0.5, 100) == pytest.approx(1.96 * 0.05)
    assert binomial_half_width(0.0, 118) == 0.0


def test_a_journal_that_holds_every_run_needs_no_training(tmp_path):
    """Seeds added later reuse the runs already journaled: nothing is started for them (no Ray here)."""
    from benchmarks.learning_efficiency import RunJournal

    journal = RunJournal(tmp_path / "runs.jsonl", code_version="test")
    for index, seed in enumerate((0, 1)):
        shift = index % len(ARMS)
        for arm in ARMS[shift:] + ARMS[:shift]:
            overrides = [*arm.config_overrides(), f"training.seed={seed}"]
            journal.add({"preset": "cpu-smollm2-arith", "steps": 6, "arm": arm.name, "overrides": overrides},
                        _record(arm.name, seed, 0.5 + 0.01 * seed))
    records = run_grid([0, 1], RunJournal(tmp_path / "runs.jsonl", code_version="test"), steps=6)
    assert [(r["arm"], r["seed"]) for r in records] == [
        ("none", 0), ("ets-release", 0), ("gmts-release", 0),
        ("ets-release", 1), ("gmts-release", 1), ("none", 1)]  # interleaved, arms rotated per seed


def test_a_run_is_either_a_time_budget_or_a_step_count():
    with pytest.raises(ValueError, match="exactly one"):
        run_grid([0], None, budget_s=60.0, steps=6)
    with pytest.raises(ValueError, match="exactly one"):
        run_grid([0], None)
