"""Tune's status table names each trial by what it is (the method or recipe and its share of tokens), not t000."""

from types import SimpleNamespace

from sweeps.spec import SweepSpec, expand
from sweeps.tuner import TRIAL_KEY, _status_name, status_labels


def test_status_names_say_the_method_or_recipe():
    spec = SweepSpec.model_validate({"name": "demo", "base": {"preset": "cpu-tiny-s"},
                                     "grid": {"method": ["none", "ets-release"], "ratio": [0.2]}})
    trials = expand(spec)
    labels = status_labels(trials)
    names = [_status_name(labels, SimpleNamespace(config={TRIAL_KEY: trial.name})) for trial in trials]
    assert names == ["All tokens (t000)", "ETS-release top-20 % (t001)"]
