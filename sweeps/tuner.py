"""Build (or restore) the Ray Tune ``Tuner`` that runs a sweep's trials.

The grid is one Tune axis, ``trial`` (the trial names); each trial's validated ExperimentConfig
travels with the trainable (``tune.with_parameters``), and its resources are a placement group
of its own bundles (``tune.with_resources`` + ``PlacementGroupFactory(run_bundles(config))``), so
trials with different model sizes get different groups and never oversubscribe the cluster.
"""

from __future__ import annotations

import functools
from typing import Any

from ray import tune

from sweeps.layout import SweepLayout
from sweeps.labels import trial_label
from sweeps.spec import SweepSpec, Trial
from sweeps.trainable import run_trial, trial_resources
from sweeps.trial_progress import TrialProgressBars

TRIAL_KEY = "trial"


def trainable(configs: dict[str, dict[str, Any]], layout: SweepLayout) -> Any:
    with_configs = tune.with_parameters(run_trial, configs=configs, checkpoints_travel=layout.durable.remote)
    return tune.with_resources(with_configs, resources=functools.partial(trial_resources, configs=configs))


def build_tuner(spec: SweepSpec, trials: list[Trial], layout: SweepLayout) -> tune.Tuner:
    configs = _configs(trials)
    return tune.Tuner(
        trainable(configs, layout),
        param_space={TRIAL_KEY: tune.grid_search([trial.name for trial in trials])},
        tune_config=tune.TuneConfig(max_concurrent_trials=spec.max_concurrent_trials,
                                    trial_name_creator=functools.partial(_status_name, status_labels(trials)),
                                    # A trial's driver process serves the next trial of the same bundles: each
                                    # new one re-imported torch, transformers and the loop (≈ 10 s of CPU). No
                                    # state carries over: train() seeds from the config, its actors are its own.
                                    reuse_actors=True),
        run_config=tune.RunConfig(
            name=layout.sweep_id,
            storage_path=layout.tune_storage,
            storage_filesystem=layout.tune_filesystem,
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            # Tune's checkpoints are markers (the real ones live in each run_dir), or with an object store the
            # real ones: a restarted trial needs only the last.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            verbose=1,
            callbacks=[progress_callback(trials)],  # pickled with the sweep's state: --resume brings it back
        ),
    )


def progress_callback(trials: list[Trial]) -> TrialProgressBars:
    """The driver's progress display: a bar per trial, named as in Tune's status table."""
    return TrialProgressBars(status_labels(trials), {t.name: t.config.training.steps for t in trials}, TRIAL_KEY,
                             interval=min(t.config.training.log_interval for t in trials))


def can_restore(layout: SweepLayout) -> bool:
    return tune.Tuner.can_restore(layout.tune_dir, storage_filesystem=layout.tune_filesystem)


def restore_tuner(trials: list[Trial], layout: SweepLayout) -> tune.Tuner:
    """Reopen an interrupted sweep: finished trials stay finished, the others continue."""
    return tune.Tuner.restore(
        layout.tune_dir, trainable(_configs(trials), layout), resume_unfinished=True, resume_errored=True,
        storage_filesystem=layout.tune_filesystem,
    )


def status_labels(trials: list[Trial]) -> dict[str, str]:
    """Per trial name, what Tune's status table and the progress bars call it."""
    return {trial.name: f"{trial_label(trial.point)} ({trial.name.rsplit('-', 1)[-1]})" for trial in trials}


def _status_name(labels: dict[str, str], trial: Any) -> str:
    """Tune's status table names a trial by what it is ("GMTS-release top-20 % · seed 0 (t002)"), not ``t002``."""
    return labels.get(trial.config.get(TRIAL_KEY), str(trial))


def _configs(trials: list[Trial]) -> dict[str, dict[str, Any]]:
    return {trial.name: trial.config.model_dump(mode="json") for trial in trials}
