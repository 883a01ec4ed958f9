"""Placement bundles of one run: separate engines and learners, or (engine r, learner r) pairs sharing one."""

import pytest

from orchestrator.config_loader import ConfigError, load_experiment
from orchestrator.resources import bundle_index, run_bundles


def _config(*overrides: str):
    return load_experiment("cpu-tiny-s", list(overrides))


GPU = ("resources.gpus_per_rollout_actor=0.4", "resources.gpus_per_learner_actor=0.6",
       "resources.cpus_per_rollout_actor=2", "resources.cpus_per_learner_actor=4")


def test_separate_bundles_put_engines_then_learners_after_the_driver():
    config = _config("rollout.num_actors=2", "learner.num_actors=2", "learner.micro_batch_size=128", *GPU)
    assert run_bundles(config) == [{"CPU": 0.01}, {"CPU": 2, "GPU": 0.4}, {"CPU": 2, "GPU": 0.4},
                                   {"CPU": 4, "GPU": 0.6}, {"CPU": 4, "GPU": 0.6}]
    assert [bundle_index(config, "rollout", r) for r in (0, 1)] == [1, 2]
    assert [bundle_index(config, "learner", r) for r in (0, 1)] == [3, 4]


def test_colocated_pairs_share_one_bundle_and_one_gpu():
    config = _config("rollout.num_actors=2", "learner.num_actors=2", "learner.micro_batch_size=128",
                     "resources.colocate=true", *GPU)
    assert run_bundles(config) == [{"CPU": 0.01}, {"CPU": 6, "GPU": 1.0}, {"CPU": 6, "GPU": 1.0}]
    for rank in (0, 1):
        assert bundle_index(config, "rollout", rank) == bundle_index(config, "learner", rank) == 1 + rank


@pytest.mark.parametrize("colocate", ["false", "true"])
def test_a_reward_worker_with_cpus_gets_the_last_bundle_and_none_by_default(colocate):
    default = _config(f"resources.colocate={colocate}")
    assert bundle_index(default, "reward", 0) == 0 and {"CPU": 0.01} == run_bundles(default)[0]
    actor_bundles = 1 if colocate == "true" else 2  # (engine, learner) pair, or one each
    assert len(run_bundles(default)) == 1 + actor_bundles  # no bundle of its own

    config = _config(f"resources.colocate={colocate}", "resources.cpus_per_reward_worker=0.5")
    bundles = run_bundles(config)
    # Tune hands bundle 0 whole to the trial's function: the reward actor's CPUs must be elsewhere.
    assert bundles[:-1] == run_bundles(default) and bundles[-1] == {"CPU": 0.5}
    assert bundle_index(config, "reward", 0) == len(bundles) - 1


@pytest.mark.parametrize("overrides,message", [
    (("rollout.num_actors=2",), "rollout.num_actors (2) must equal learner.num_actors (1)"),
    (("rollout.tensor_parallel_size=2",), "tensor_parallel_size > 1"),
    (("resources.gpus_per_rollout_actor=0.5", "resources.gpus_per_learner_actor=0.75"), "exceeds the one GPU"),
])
def test_colocation_that_cannot_pair_is_refused_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match="resources.colocate") as error:
        _config("resources.colocate=true", *overrides)
    assert message in str(error.value)
