"""The one typed configuration tree of an experiment.

YAML presets (orchestrator/presets/), ``--set a.b=c`` overrides, REST request bodies and MLflow
params are all this tree: the models below are the single source of truth. Each component owns
its part (``workers.models.config.ModelConfig`` …); this module composes them and adds the parts
that belong to the RL loop itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.data.config import DataConfig
from orchestrator.advantages import ADVANTAGE_ESTIMATORS
from workers.learner.config import LearnerConfig
from workers.learner.losses import PolicyLossConfig
from workers.learner.selection import SelectionConfig
from workers.models.config import ModelConfig
from workers.registry import Registered
from workers.reward.config import RewardConfig
from workers.rollout.config import RolloutConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OverlongConfig(_Strict):
    """DAPO's soft overlong punishment (added to the reward of long responses)."""

    enabled: bool = False
    buffer: int | None = Field(
        None, gt=0, description="L_cache: the ramp starts this many tokens before max_new_tokens; None = 20 % of "
        "max_new_tokens (DAPO's 4096 of 20480).")
    factor: float = Field(1.0, ge=0.0)


# Per-algorithm defaults, as in the GRPO (DeepSeekMath) and DAPO papers; any field set explicitly wins.
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "grpo": {
        "advantage_estimator": "grpo",
        "dynamic_sampling": False,
        "loss": {"clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.001, "kl_estimator": "low_var_kl",
                 "loss_agg": "seq-mean-token-mean"},
        "overlong": {"enabled": False},
    },
    "dapo": {
        "advantage_estimator": "grpo",
        "dynamic_sampling": True,
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "loss_agg": "token-mean"},
        "overlong": {"enabled": True},
    },
}


class AlgorithmConfig(_Strict):
    name: Literal["grpo", "dapo"] = "grpo"
    advantage_estimator: Registered(ADVANTAGE_ESTIMATORS, "advantage_estimator") = Field(  # type: ignore[valid-type]
        "grpo", description="A registered advantage estimator (register_advantage_estimator): grpo, grpo_no_std, rloo.")
    loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    dynamic_sampling: bool = Field(False, description="DAPO: resample until the batch holds enough informative groups.")
    max_resample_rounds: int = Field(4, ge=0, description="Extra rollout rounds dynamic sampling may spend per step.")
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)

    @model_validator(mode="before")
    @classmethod
    def _fill_algorithm_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("name", "grpo")
        defaults = ALGORITHM_DEFAULTS.get(name) if isinstance(name, str) else None  # else: the field's own error
        return data if defaults is None else _deep_merge(defaults, data)


class WarmupConfig(_Strict):
    """Supervised warm-up that gives a from-scratch tiny model a base policy (cached on disk)."""

    enabled: bool = False
    steps: int = Field(600, ge=1)
    lr: float = Field(3e-3, gt=0)
    batch_size: int = Field(64, ge=1)
    examples: int = Field(4000, ge=1, description="Training problems drawn for the warm-up.")
    seed: int = Field(0, description="Fixed apart from training.seed: every seed of a sweep starts from one base policy.")


class TrainingConfig(_Strict):
    steps: int = Field(10, ge=1, description="RL steps (one rollout batch + one learner update each).")
    seed: int = Field(0, description="The run's one seed: prompt order and rollout sampling use it, and "
                      "learner.seed, selection.seed, rollout.seed and evaluation.seed default to it. Fixed whatever "
                      "it is: the base policy's warmup.seed and model.init_seed, and the data sets' seeds (one base "
                      "policy and one test set for every seed of a sweep).")
    log_interval: int = Field(1, ge=1, description="Steps between two plain progress lines when the output is not "
                              "a terminal (CI, Ray job logs); on a terminal the progress bar follows every step.")


class EvaluationConfig(_Strict):
    interval: int = Field(0, ge=0, description="Evaluate every N steps (0 = only before and after training).")
    greedy: bool = Field(True, description="Greedy decoding (one answer per problem); else k samples at the rollout temperature.")
    k: int = Field(1, ge=1, description="Samples per problem when not greedy: avg@k and unbiased pass@k.")
    max_problems: int | None = Field(None, ge=1, description="Cap per validation set (None = all).")
    seed: int = Field(0, description="Seeds sampled (non-greedy) evaluation per prompt: the same weights give the same score.")
    compare_to_base: bool = Field(True, description="Also log eval/<set>/changed_vs_base and kl_to_base (one extra "
                                  "sample per problem at step 0 and one learner forward per evaluation).")
    shown_completions: int = Field(16, ge=0, description="Log a table of this many held-out problems per eval set (the "
                                   "first ones, the same at every evaluation): prompt, first completion, extracted "
                                   "answer, reference, reward, as MLflow artifact completions/<set>/step_NNNNNN.json "
                                   "(0 = none).")

    @model_validator(mode="after")
    def _greedy_means_one_sample(self) -> EvaluationConfig:
        if self.greedy and self.k != 1:
            raise ValueError("k: greedy evaluation gives one answer per problem; set k=1 or greedy=false")
        return self


class CheckpointConfig(_Strict):
    interval: int = Field(0, ge=0, description="Save every N steps (0 = never); a killed run loses < N steps.")
    keep_last: int = Field(2, ge=1)
    node_local: bool = Field(False, description="Each node sees only its own disk under output_dir (a sweep on an "
                             "object store sets it): learner ranks on other nodes send their checkpoint files to the "
                             "run's driver after a save and get the folder back before a resume.")


# Names of runs, sweeps and MLflow experiments: they become folder names, MLflow search filters and
# URL parts, so no quotes, '$(…)', slashes or newlines.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


class TrackingConfig(_Strict):
    tracking_uri: str | None = Field(None, description="MLflow tracking URI; None = $MLFLOW_TRACKING_URI or the run's SQLite store.")
    experiment: str = Field("gmts-lab", pattern=NAME_PATTERN, description="MLflow experiment (letters, digits, '.', '_', '-').")
    run_name: str | None = None
    parent_run_id: str | None = Field(None, description="Nest this run under a sweep's parent run.")
    tags: dict[str, str] = Field(default_factory=dict)


class ResourcesConfig(_Strict):
    cpus_per_rollout_actor: float = Field(1.0, gt=0)
    cpus_per_learner_actor: float = Field(1.0, gt=0)
    cpus_per_reward_worker: float = Field(
        0.0, ge=0, description="Reward scoring is light; 0 lets it share a core. Above 0 it is a bundle of its own in "
                               "the run's placement group (a sweep trial reserves it).")
    gpus_per_rollout_actor: float = Field(0.0, ge=0)
    gpus_per_learner_actor: float = Field(0.0, ge=0)
    colocate: bool = Field(
        False, description="Rollout engine r and learner rank r share one placement bundle (one GPU: give each a "
        "fraction, e.g. 0.5, and lower rollout.gpu_memory_utilization); False = separate GPUs."
    )


# Sections whose ``seed`` defaults to ``training.seed`` (see ExperimentConfig._derive_seeds_from_training_seed).
RUN_SEEDED_SECTIONS = ("learner", "selection", "rollout", "evaluation")


class ExperimentConfig(_Strict):
    name: str = Field("experiment", pattern=NAME_PATTERN)
    output_dir: Path = Field(Path("runs"), description="Run folders (checkpoints, model caches, MLflow store) go here.")
    model: ModelConfig
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    data: DataConfig
    reward: RewardConfig = Field(default_factory=RewardConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)

    @model_validator(mode="after")
    def _derive_seeds_from_training_seed(self) -> ExperimentConfig:
        """One seed per run: a section's ``seed`` left unset follows ``training.seed``, so a sweep's seed
        axis (which sets only ``training.seed``) also varies the mini-batch shuffle, the random-selection
        draws and tie-breaks. The resolved values are part of the config, hence of every MLflow run's
        params, job file and checkpoint. An explicit section seed wins (to replay an older run)."""
        for section in RUN_SEEDED_SECTIONS:
            part = getattr(self, section)
            if "seed" not in part.model_fields_set:
                setattr(self, section, part.model_copy(update={"seed": self.training.seed}))
        return self

    @model_validator(mode="after")
    def _rollout_logprobs_are_the_policy_when_they_stand_for_old_logp(self) -> ExperimentConfig:
        if self.learner.old_logp_source == "rollout" and (self.rollout.top_p != 1.0 or self.rollout.top_k != 0):
            raise ValueError(
                f"learner.old_logp_source='rollout': the engine's logprobs are π only without truncation, but "
                f"rollout.top_p={self.rollout.top_p} and rollout.top_k={self.rollout.top_k} renormalise over the kept "
                "tokens; set top_p=1 and top_k=0, or old_logp_source='learner'")
        return self

    @model_validator(mode="after")
    def _stale_batches_take_pi_old_from_the_engine(self) -> ExperimentConfig:
        # A batch sampled k versions ago has the engine's logprobs as its behaviour policy; the learner's own pass
        # would give the current weights' π instead, and the ratio would not correct for the lag at all.
        if self.rollout.max_staleness > 0 and self.learner.old_logp_source != "rollout":
            raise ValueError(
                f"rollout.max_staleness={self.rollout.max_staleness} trains on batches sampled by older weights, "
                "whose π_old is the engine's sampling logprobs: set learner.old_logp_source='rollout' (it is "
                f"{self.learner.old_logp_source!r})")
        return self

    @model_validator(mode="after")
    def _colocation_pairs_engines_with_learners(self) -> ExperimentConfig:
        res = self.resources
        if not res.colocate:
            return self
        if self.rollout.num_actors != self.learner.num_actors:
            raise ValueError(f"resources.colocate: pairs rollout engine r with learner rank r, so rollout.num_actors "
                             f"({self.rollout.num_actors}) must equal learner.num_actors ({self.learner.num_actors})")
        if self.rollout.tensor_parallel_size != 1:
            raise ValueError("resources.colocate: an engine with rollout.tensor_parallel_size > 1 spans several GPUs "
                             "and cannot share one with a learner rank")
        if res.gpus_per_rollout_actor + res.gpus_per_learner_actor > 1:
            raise ValueError(f"resources.colocate: gpus_per_rollout_actor + gpus_per_learner_actor = "
                             f"{res.gpus_per_rollout_actor + res.gpus_per_learner_actor} exceeds the one GPU they share")
        return self

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.name

    def tracking_uri(self) -> str:
        """Config first, then the environment, then a SQLite store beside the runs — unless that store
        would lie in Ray's temporary copy of a job's working directory (UnfindableStore)."""
        if self.tracking.tracking_uri:
            return self.tracking.tracking_uri
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        return default_store_uri(self.output_dir, "tracking.tracking_uri", "output_dir")


class UnfindableStore(ValueError):
    """No tracking URI was given and the default SQLite store would vanish with Ray's job folder."""


def ray_working_dir_copy(path: Path) -> Path | None:
    """The folder of Ray's temporary working-dir copy that ``path`` lies in, else None.

    ``ray job submit --working-dir .`` uploads the folder and runs the job in an unpacked copy,
    ``<ray temp>/session_…/runtime_resources/working_dir_files/_ray_pkg_<hash>/``: a relative
    ``output_dir`` (default ``runs``) lands in there, out of the user's sight, and Ray deletes it."""
    parts = path.resolve().parts
    for index in range(len(parts) - 1):
        if parts[index:index + 2] == ("runtime_resources", "working_dir_files"):
            return Path(*parts[:index + 3])
    return None


def default_store_uri(output_dir: Path, uri_field: str, dir_field: str) -> str:
    """``sqlite:///<output_dir>/mlflow.db``; refused inside a Ray job's temporary working-dir copy, where
    a run would log silently into a store no MLflow UI shows, naming what to set instead."""
    store = (output_dir / "mlflow.db").resolve()
    copy = ray_working_dir_copy(store)
    if copy is not None:
        raise UnfindableStore(
            f"{uri_field}: not set, and MLFLOW_TRACKING_URI is not set either, so this run would log into "
            f"{store}, inside Ray's temporary copy of the job's working directory ({copy}), which no MLflow "
            "UI shows and Ray deletes. Set MLFLOW_TRACKING_URI for the job (ray job submit --runtime-env-json "
            '\'{"env_vars": {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}}\' …), or '
            f"{uri_field}=<uri>, or an absolute {dir_field} outside that copy")
    return f"sqlite:///{store}"


def flatten(config: BaseModel) -> dict[str, str]:
    """Dotted keys → string values: the MLflow params of a run (and the keys ``--set`` accepts)."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        else:
            flat[prefix] = str(value)

    walk("", config.model_dump(mode="json"))
    return flat


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
