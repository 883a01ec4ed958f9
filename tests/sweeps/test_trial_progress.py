"""The sweep driver's progress: Tune's per-step results of each trial become its bar or its plain lines."""

from __future__ import annotations

import logging
import pickle

import pytest
from ray.tune.experiment import Trial

from sweeps.spec import SweepSpec, expand
from sweeps.trainable import FINAL_KEY, STEP_KEY
from sweeps.tuner import TRIAL_KEY, progress_callback


@pytest.fixture
def trials():
    spec = SweepSpec.model_validate({"name": "demo", "base": {"preset": "cpu-tiny-s",
                                                              "overrides": {"training.steps": 4}},
                                     "grid": {"method": ["ets-release", "gmts-release"], "ratio": [0.2]}})
    return expand(spec)


def _tune_trial(name: str) -> Trial:
    # A real Tune Trial record (stub: no trainable registered, nothing started), as the callback receives it.
    return Trial("run_trial", config={TRIAL_KEY: name}, stub=True)


def test_each_trial_gets_its_own_lines_off_a_terminal(trials, caplog: pytest.LogCaptureFixture) -> None:
    callback = progress_callback(trials)
    assert not callback.board.live  # pytest's stderr is no terminal
    ets, gmts = (_tune_trial(t.name) for t in trials)
    with caplog.at_level(logging.INFO, logger="orchestrator.progress"):
        for step in range(1, 5):
            metrics = {"reward/mean": 0.1 * step, "train/accuracy": 0.1 * step, "time_this_iter_s": 1.0}
            if step == 2:
                metrics["eval/arithmetic/accuracy"] = 0.25
            callback.on_trial_result(step, [ets, gmts], ets, {**metrics, STEP_KEY: step, FINAL_KEY: 0})
        callback.on_trial_result(5, [ets, gmts], ets,
                                 {"eval/arithmetic/accuracy": 0.5, STEP_KEY: 4, FINAL_KEY: 1, "run_id": "r"})
        callback.on_trial_result(6, [ets, gmts], gmts, {"reward/mean": 0.3, STEP_KEY: 1, FINAL_KEY: 0})
        callback.on_trial_result(7, [ets, gmts], gmts, {"time_total_s": 3.0})  # a Tune-only result: ignored
        callback.on_trial_complete(8, [ets, gmts], ets)
        callback.on_experiment_end([ets, gmts])
    lines = [r.getMessage() for r in caplog.records if r.name == "orchestrator.progress"]
    assert lines[0] == "ETS-release top-20 % (t000) step 1/4 · reward 0.100 · eval — | train/accuracy=0.1"
    assert lines[3] == ("ETS-release top-20 % (t000) step 4/4 · reward 0.400 · eval arithmetic 25.0 % (step 2) | "
                        "train/accuracy=0.4")
    assert lines[4].startswith("GMTS-release top-20 % (t001) step 1/4 · reward 0.300")
    assert len(lines) == 5  # one per step per trial: the final evaluation (same step) adds none
    assert callback.board.states[trials[0].name].eval_text == "eval arithmetic 50.0 % (step 4)"


def test_the_callback_survives_tunes_pickle_without_its_display(trials) -> None:
    callback = progress_callback(trials)
    callback.on_trial_result(1, [], _tune_trial(trials[0].name), {"reward/mean": 0.2, STEP_KEY: 1})
    restored = pickle.loads(pickle.dumps(callback))
    assert restored._board is None and restored.labels == callback.labels
    assert restored.totals == {t.name: 4 for t in trials}
