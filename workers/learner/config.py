"""How the learner trains: the DeepSpeed group, the optimiser and the PPO batch schedule.

Batch sizes count sequences (one rollout = one sequence):
- ``mini_batch_size``: sequences per optimiser step, summed over the whole learner group;
- ``micro_batch_size``: sequences per forward/backward pass on one rank (gradient accumulation
  runs mini_batch_size / (num_actors · micro_batch_size) of them per step).
- ``max_tokens_per_micro_batch`` (optional): form the training micro-batches by a token budget instead
  (``schedule.pack_by_tokens``, like verl's ``use_dynamic_bsz``).
Micro- and mini-batches hold whole prompt groups (see ``batch.TrainBatch.split``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class LearnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_actors: int = Field(1, ge=1, description="Learner ranks (Ray actors), one DeepSpeed data-parallel process each.")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage: 0 (plain DDP) to 3 (parameters sharded).")
    lr: float = Field(1e-6, gt=0.0, description="AdamW learning rate.")
    lr_warmup_steps: int = Field(
        0, ge=0, description="Optimiser steps of linear learning-rate warm-up from 0 (then constant). Adam's first "
        "updates move every weight by about lr whatever its gradient's noise; a warm-up keeps a small batch's noise "
        "from knocking a small policy off its base (like verl's lr_warmup_steps)."
    )
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (β1, β2), each in [0, 1).")
    grad_clip: float = Field(1.0, ge=0.0, description="Global gradient-norm clip; 0 = off.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over the batch per RL step.")
    mini_batch_size: int = Field(
        64, ge=1, description="Sequences per optimiser step across all learner ranks (whole prompt groups)."
    )
    micro_batch_size: int = Field(
        8, ge=1, description="Sequences per forward/backward pass on one rank (with max_tokens_per_micro_batch "
        "set: per no-grad pass only, e.g. compute_reference_stats)."
    )
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=1, description="Dynamic batch size: training micro-batches are packed by this token budget "
        "(rows × longest sequence, padding included), short sequences together, instead of micro_batch_size "
        "rows. The loss and its gradient are unchanged (aggregation weights span the whole mini-batch)."
    )
    threads_per_actor: int = Field(1, ge=1, description="torch intra-op threads of each learner actor.")
    bf16: bool = Field(False, description="bf16 weights and activations (DeepSpeed keeps fp32 master weights).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    gradient_norm_stats: bool = Field(
        False,
        description=(
            "Compute G_t = ‖e_o − p‖ for every token (selection/spearman_entropy_gradnorm) even when the "
            "selection method does not need it (only gmts_exact does)."
        ),
    )
    old_logp_source: Literal["learner", "rollout"] = Field(
        "learner", description="π_old of the importance ratio when an RL step holds several optimiser steps. "
        "'learner': a no-grad forward of the learner before the update (one extra forward per step). "
        "'rollout': the logprobs the vLLM engine sampled with, no extra forward (verl's "
        "recompute_old_log_prob=False, NeMo-RL's skip_prev_logprobs); the ratio then also carries the engine–"
        "learner numeric gap (reported as rollout/logprob_diff, over the first mini-batch). Needs "
        "rollout.top_p=1 and rollout.top_k=0, under which the engine's logprobs are the learner's π."
    )
    seed: int = Field(0, description="Seed of the mini-batch shuffle (default: training.seed).")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"AdamW betas must each lie in [0, 1), got {betas}")
        return betas

    @field_validator("mini_batch_size")
    @classmethod
    def _mini_batch_splits_over_ranks(cls, mini: int, info: ValidationInfo) -> int:
        actors = info.data.get("num_actors")
        if actors is not None and mini % actors:
            raise ValueError(
                f"mini_batch_size={mini} counts sequences across all learner ranks and must be a multiple of "
                f"num_actors={actors}"
            )
        return mini

    @field_validator("micro_batch_size")
    @classmethod
    def _micro_batch_divides_rank_share(cls, micro: int, info: ValidationInfo) -> int:
        actors, mini = info.data.get("num_actors"), info.data.get("mini_batch_size")
        if actors is None or mini is None:  # those fields failed their own validation
            return micro
        per_rank = mini // actors
        if per_rank % micro:
            raise ValueError(
                f"micro_batch_size={micro} must divide each rank's share of the mini-batch, "
                f"mini_batch_size / num_actors = {mini} / {actors} = {per_rank}"
            )
        return micro

    @property
    def mini_batch_per_rank(self) -> int:
        return self.mini_batch_size // self.num_actors

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimiser step on one rank when groups pack evenly."""
        return self.mini_batch_per_rank // self.micro_batch_size
