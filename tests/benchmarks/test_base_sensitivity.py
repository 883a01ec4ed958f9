"""``python -m benchmarks.base_sensitivity``: one preset's warm-up scored at some factors of its steps, as the preset
evaluates, with the sampled answers to the first test problems that its accuracy counts."""

from __future__ import annotations

import json

import pytest

from benchmarks import base_sensitivity
from orchestrator.config_loader import load_experiment
from orchestrator.data import load_dataset
from workers.reward.arithmetic_verifier import verify_arithmetic


@pytest.mark.parametrize(("args", "named"), [(["--factors", "1.0", "0"], "--factors"), (["--limit", "0"], "--limit")])
def test_bad_arguments_are_refused_naming_them(args, named, capsys) -> None:
    with pytest.raises(SystemExit):
        base_sensitivity.main(["--preset", "cpu-tiny-s", *args])
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_a_probe_scores_its_warm_up_and_shows_the_answers_it_counts(capsys) -> None:
    # The benchmark smoke's 50-step warm-up: whichever of the two runs first warms it up, the other finds it cached.
    base_sensitivity.main(["--preset", "cpu-tiny-s", "--set", "warmup.steps=50", "--factors", "1.0", "--limit", "8"])
    score, verdict = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert (score["preset"], score["overrides"], score["factor"], score["steps"]) == (
        "cpu-tiny-s", ["warmup.steps=50"], 1.0, 50)
    assert score["problems"] == 8 and score["accuracy"] == score["correct"] / (8 * score["samples"])
    config = load_experiment("cpu-tiny-s", ["warmup.steps=50"])
    problems = load_dataset(config.data.eval[base_sensitivity.TEST_SET].model_copy(update={"limit": 8}))
    shown = score["answers"]
    assert [row["id"] for row in shown] == [problem.id for problem in problems[:base_sensitivity.SHOWN_ANSWERS]]
    for row, problem in zip(shown, problems):
        assert row["prompt"] == problem.prompt and len(row["answers"]) == score["samples"]
        assert row["rewards"] == [verify_arithmetic(text, problem) for text in row["answers"]]
    assert sum(reward == 1.0 for row in shown for reward in row["rewards"]) <= score["correct"]
    assert score["mixed_problems"] == 0  # one greedy answer a problem: nothing to disagree
    # One factor has no spread: no verdict, and the line says why.
    assert (verdict["preset"], verdict["overrides"], verdict["largest_difference_points"], verdict["plateau"]) == (
        "cpu-tiny-s", ["warmup.steps=50"], None, None)
    assert "factor 1.0" in verdict["reason"]


@pytest.mark.parametrize(("rewards", "disagree"), [([1.0, 0.0, 1.0, 1.0], True), ([0.0, 1.0], True),
                                                   ([1.0, 1.0, 1.0, 1.0], False), ([0.0, 0.0], False), ([1.0], False)])
def test_a_problem_counts_as_mixed_only_when_its_samples_disagree(rewards, disagree) -> None:
    assert base_sensitivity.samples_disagree(rewards) is disagree


@pytest.mark.parametrize(("accuracies", "spread", "plateau"), [
    ({1.0: 92.53, 0.9: 93.13, 1.1: 94.50}, 1.97, True),
    ({1.0: 50.0, 0.9: 48.5, 1.1: 52.25}, 2.25, False),
    ({1.0: 50.0, 1.1: 48.0}, 2.0, True),
    ({1.0: 50.0}, None, None),            # one score: no spread to judge
    ({0.9: 50.0, 1.1: 50.0}, None, None),  # no 1.0: nothing to measure the change from
])
def test_the_plateau_verdict_measures_change_from_the_presets_own_warm_up(accuracies, spread, plateau) -> None:
    verdict = base_sensitivity.plateau_verdict(accuracies)
    assert (verdict["largest_difference_points"], verdict["plateau"]) == (spread, plateau)
    assert ("reason" in verdict) is (plateau is None)
