"""Tune's status table names each trial by its grid point (the method or recipe), not only by t000."""

from types import SimpleNamespace

from sweeps.spec import SweepSpec, expand
from sweeps.tuner import TRIAL_KEY, _labels, _status_name


def test_status_names_say_the_method_or_recipe():
    spec = SweepSpec.model_validate({"name": "demo", "base": {"preset": "cpu-tiny-s"},
                                     "grid": {"method": ["none", "ets-release"], "ratio": [0.2]}})
    trials = expand(spec)
    labels = _labels(trials)
    names = [_status_name(labels, SimpleNamespace(config={TRIAL_KEY: trial.name})) for trial in trials]
    assert names == ["demo-t000 method=none", "demo-t001 method=ets-release,ratio=0.2"]
