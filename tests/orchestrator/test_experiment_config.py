import pytest

from orchestrator.config import flatten
from orchestrator.config_loader import ConfigError, load_experiment, preset_names


def test_every_preset_validates(gpu_roots):
    names = preset_names()
    assert {"cpu-tiny-s", "cpu-tiny-m", "cpu-smollm2", "qwen2.5-math-1.5b", "qwen2.5-math-7b", "qwen3-8b"} <= set(names)
    models = gpu_roots
    for name in names:
        config = load_experiment(name)
        if config.model.source == "hf":
            assert config.model.path.parent == models and config.rollout.n_samples == 16


def test_gpu_presets_without_the_model_root_name_the_field(monkeypatch):
    monkeypatch.delenv("GMTS_MODELS_DIR", raising=False)
    with pytest.raises(ConfigError, match=r"model\.path"):
        load_experiment("qwen2.5-math-1.5b")


def test_overrides_are_typed_and_extends_merges():
    config = load_experiment("cpu-tiny-m", ["selection.ratio=0.5", "selection.mode=bottom", "training.steps=3"])
    assert config.selection.ratio == 0.5 and config.selection.mode == "bottom" and config.training.steps == 3
    assert config.model.hidden_size == 256 and config.rollout.max_new_tokens == 5  # inherited from cpu-tiny-s


def test_algorithm_defaults_follow_the_papers_and_explicit_fields_win():
    dapo = load_experiment("cpu-tiny-s", ["algorithm.name=dapo"]).algorithm
    assert (dapo.loss.clip_high, dapo.loss.kl_coef, dapo.loss.loss_agg, dapo.dynamic_sampling) == (0.28, 0.0, "token-mean", True)
    grpo = load_experiment("cpu-tiny-s", ["algorithm.name=grpo", "algorithm.loss.kl_coef=0.01"]).algorithm
    assert grpo.loss.kl_coef == 0.01 and grpo.loss.loss_agg == "seq-mean-token-mean" and not grpo.dynamic_sampling


@pytest.mark.parametrize(
    "override,field",
    [("selection.ratio=2.0", "selection.ratio"), ("selection.method=magic", "selection.method"),
     ("learner.zero_stage=7", "learner.zero_stage"), ("model.hidden_size=100", "model.num_attention_heads"),
     ("rollout.unknown=1", "rollout.unknown"), ("evaluation.k=4", "evaluation"),
     ('tracking.experiment="$(id)"', "tracking.experiment")],
)
def test_errors_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_experiment("cpu-tiny-s", [override])


def test_bad_sources_and_override_syntax():
    with pytest.raises(ConfigError, match="neither a file nor a preset"):
        load_experiment("no-such-preset")
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_experiment("cpu-tiny-s", ["selection.ratio"])


def test_flatten_gives_dotted_params():
    flat = flatten(load_experiment("cpu-tiny-s"))
    assert flat["selection.method"] == "gmts" and flat["algorithm.loss.clip_high"] == "0.2"


def test_every_run_seed_follows_training_seed_unless_set_and_the_base_seeds_stay_fixed():
    config = load_experiment("cpu-tiny-s", ["training.seed=3"])
    assert [getattr(config, s).seed for s in ("learner", "selection", "rollout", "evaluation")] == [3, 3, 3, 3]
    assert (config.warmup.seed, config.model.init_seed) == (0, 0)  # one base policy for every seed of a sweep
    explicit = load_experiment("cpu-tiny-s", ["training.seed=3", "learner.seed=7"])
    assert (explicit.learner.seed, explicit.selection.seed) == (7, 3)
    # The resolved seeds are part of the config: a dumped job file re-validates to the same run.
    again = type(explicit).model_validate(explicit.model_dump(mode="json"))
    assert again.model_dump() == explicit.model_dump()
    assert str(flatten(config)["learner.seed"]) == "3"  # hence an MLflow param of every run


def test_a_sweeps_seed_axis_varies_every_run_seed(tmp_path):
    from sweeps.spec import SweepSpec, expand

    spec = SweepSpec.model_validate({"name": "s", "base": {"preset": "cpu-tiny-s"},
                                     "grid": {"method": ["none"], "seed": [0, 1]}})
    seeds = [(t.config.training.seed, t.config.learner.seed, t.config.selection.seed) for t in expand(spec, tmp_path)]
    assert seeds == [(0, 0, 0), (1, 1, 1)]


@pytest.mark.parametrize("truncation", ["rollout.top_p=0.9", "rollout.top_k=5"])
def test_old_logp_from_the_rollout_is_refused_under_truncated_sampling(truncation):
    """Under top-p/top-k the engine's logprobs are renormalised over the kept tokens: not π, so not π_old."""
    assert load_experiment("cpu-tiny-s", ["learner.old_logp_source=rollout"]).learner.old_logp_source == "rollout"
    with pytest.raises(ConfigError, match=r"learner.old_logp_source='rollout'.*top_p=1 and top_k=0"):
        load_experiment("cpu-tiny-s", ["learner.old_logp_source=rollout", truncation])
    with pytest.raises(ConfigError, match="old_logp_source"):
        load_experiment("cpu-tiny-s", ["learner.old_logp_source=vllm"])
