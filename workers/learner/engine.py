"""The learner of one rank: a DeepSpeed engine around the policy, and the PPO update with token selection.

One RL update, per rank (``train_step``):

    for epoch in ppo_epochs:
        shuffle the prompt groups, pack them into mini-batches          (schedule.split_groups)
        for mini-batch: for micro-batch:
            ONE forward  → logits at the response positions only         (forward.response_logits)
                         → logp (with grad), entropy, G                   (token_stats_from_logits)
            select_tokens(...)                                            (selection.py)
              (scope mini_batch/global with several micro-batches: selected beforehand, see below)
            ppo_clip_loss(..., pg_mask / loss_mask from the selection,    (losses.py)
                          terms: a token method's per-token A / clip / KL / |log r| penalty)
            backward; the optimiser steps at the mini-batch boundary      (DeepSpeed)

The token scores come from the same forward pass that carries the gradient — no extra no-grad
pass per mini-batch (the released GMTS code spends one) — except for ``scope`` ``mini_batch`` or
``global`` when a mini-batch has several micro-batches: an exact threshold over the optimiser step
needs every token's score before the first backward, so the learner then runs one no-grad forward
per micro-batch first (``schedule.needs_scoring_pass``; the weights do not change inside a step,
so the scores are those the training forward would compute). That pass costs about one forward of
the mini-batch (time/selection_scoring_s; benchmarks/selection_step.py measures it). ``old_logp`` (π_old) must come with the
batch or is computed by ``train_step`` itself on this rank's shard when the schedule or KL needs it
(``schedule.needs_reference_pass``: several epochs or mini-batches, or ``kl_coef > 0`` for π_ref);
in the strictly on-policy case (one epoch, one mini-batch) π_old = π exactly and the current logp
(detached) is used. With ``learner.old_logp_source='rollout'`` the rollout's sampling logprobs stand for
π_old and that pass is skipped (π_ref, under KL, still gets its own). When the batch carries the rollout's
sampling logprobs, the learner reports their agreement with its own π_old (``rollout/logprob_diff``: a drift
means a broken weight sync) — from its pass, or, without one, from the first mini-batch's forwards, which run
at the weights the engine sampled with.

Loss scale under gradient accumulation. Each micro-batch loss from ``ppo_clip_loss`` is its own
aggregate (a mean over its tokens or sequences). Before backward it is multiplied by
``u_micro / U_mini · world``, where u counts the aggregation's units in the micro-batch
(response tokens for ``token-mean``, sequences with a response for the ``seq-mean-*`` modes), U
sums them over the mini-batch on every rank, and ``world`` undoes DeepSpeed's averaging of
gradients over ranks. The accumulated gradient is then exactly the gradient of the one aggregate
over the whole mini-batch on all ranks (for ``seq-mean-token-sum-norm`` the constant length is the
batch's T when the config leaves it unset, so trimming micro-batches does not change it). With
``apply_to='loss'`` the aggregation counts *selected* tokens, which are only known after each
micro-batch's forward. The policy-gradient term is then weighted by selected-token units
instead, exact whenever the whole mini-batch's selection is known before its first backward
(scopes mini_batch/global, or a mini-batch of one micro-batch); for group/micro_batch scopes with
several micro-batches it uses response-token units, exact when every micro-batch keeps the same
fraction of its tokens. The KL and entropy terms always cover every response token. The same weights make token-budget micro-batches (``max_tokens_per_micro_batch``) exact:
however a mini-batch is cut, the weighted micro-batch losses add up to the one mini-batch aggregate
(``scope='group'`` selection sees whole groups either way; ``scope='micro_batch'`` ranks per
micro-batch, so it depends on the cut by definition; ``mini_batch``/``global`` do not).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from workers.learner.batch import ResponseIndex, TrainBatch
from workers.learner.deepspeed_ops import import_deepspeed, load_cpu_comm_op
from workers.learner.forward import response_logits
from workers.learner.config import LearnerConfig
from workers.learner.diagnostics import omega_vs_advantage_ranking, selection_diagnostics
from workers.learner.rendezvous import Rendezvous
from workers.rendezvous import listening_store, pin_gloo_to
from workers.learner.losses import PolicyLossConfig, aggregation_weights, effective_grad_coef, ppo_clip_loss
from workers.weights.object_store import HostWeights
from workers.learner.schedule import (loss_scale, loss_units, needs_reference_pass, needs_scoring_pass, pack_by_tokens,
                                      row_spans, schedule_units, split_groups, stack_rows)
from workers.learner.selection import SELECTION_METHODS, Selection, SelectionConfig, select_tokens
from workers.learner.token_stats import entropy_from_logits, token_stats_from_logits
from workers.weights.broadcast import WeightBroadcastGroup, join_group, local_device_key, send_weights

# DeepSpeed and transformers' model classes are imported where they are used, in the learner's own process: the
# driver imports this module for the actor class alone, and the two cost seconds of every run's and every sweep
# trial's start (≈ 4 s of the driver's 7 s on a 2-core host).

logger = logging.getLogger(__name__)

CHECKPOINT_TAG = "learner"
MINI_BATCH_LOSSES = ("loss/total", "loss/pg")  # reported as the mini-batch aggregate, see train_step
CLIENT_STATE_KEY = "learner_client_state"


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int, local_rank: int = 0) -> None:
    """Join the learners' process group (gloo on CPU, NCCL on CUDA), then hand it to DeepSpeed.

    The group is built on our own store, not DeepSpeed's env:// one, so that rank 0 listens on ``master_addr``
    only; DeepSpeed takes over a group that already exists. The environment variables are what DeepSpeed
    and torch read about the rank when no launcher ran.
    """
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank),
                      MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    deepspeed = import_deepspeed()

    load_cpu_comm_op()  # what init_distributed would build itself, but safe beside other checkouts and dead builds
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = deepspeed.constants.default_pg_timeout
    store = listening_store(master_addr, master_port, world_size, rank == 0, timeout)
    pin_gloo_to(master_addr)
    device = torch.device("cuda", local_rank) if backend == "nccl" and world_size > 1 else None
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                                         device_id=device)
    deepspeed.init_distributed(dist_backend=backend)


class ResponseLogitsPolicy(nn.Module):
    """The HF causal LM as DeepSpeed sees it: forward returns logits at the response positions only."""

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        self.causal_lm = causal_lm

    def forward(self, input_ids, attention_mask, rows, positions):
        return response_logits(self.causal_lm, input_ids, attention_mask, rows, positions)


@dataclass
class _MicroForward:
    """One micro-batch's forward pass, in the [B, T] response layout: logp (with its graph), entropy and G (or
    None), π_old's logp (the batch's, else this logp detached), and the entropy the loss's bonus reads."""

    logp: torch.Tensor
    entropy: torch.Tensor
    grad_norm: torch.Tensor | None
    mask: torch.Tensor
    old_logp: torch.Tensor
    entropy_in_loss: torch.Tensor


class LearnerEngine:
    def __init__(
        self,
        model_dir: str | Path,
        learner: LearnerConfig,
        loss: PolicyLossConfig,
        selection: SelectionConfig,
        temperature: float = 1.0,
        use_reference: bool = False,
        process_group: dist.ProcessGroup | None = None,
        rendezvous: Rendezvous | None = None,
    ):
        """``rendezvous``: join the learners' process group first (a collective: every rank's
        constructor runs at once); without it the caller has initialised torch.distributed."""
        if rendezvous is not None:
            # Ray sets OMP_NUM_THREADS=1 for one-CPU actors; be explicit either way (contention costs 3–40×).
            torch.set_num_threads(rendezvous.threads)
            if torch.cuda.is_available():
                torch.cuda.set_device(0)  # Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES
            init_process_group(rendezvous.rank, rendezvous.world_size, rendezvous.master_addr,
                               rendezvous.master_port, local_rank=0)
        if loss.kl_coef > 0 and not use_reference:
            raise ValueError(f"kl_coef={loss.kl_coef} needs the reference policy: set use_reference=True")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call init_process_group(...) first")
        self.learner, self.loss, self.selection = learner, loss, selection
        self.temperature = temperature
        self.process_group = process_group
        self.world_size, self.rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        self.with_grad_norm = SELECTION_METHODS[selection.method].needs_grad_norm or learner.gradient_norm_stats
        self._last_grad_norm: float | None = None
        self._warned_group_split = False
        self.weight_group: WeightBroadcastGroup | None = None  # rank 0, collective weight sync only

        started = time.perf_counter()
        self._build_engine(model_dir)
        self.reference = self._load_reference(model_dir) if use_reference else None
        self.init_seconds = time.perf_counter() - started
        logger.info("learner rank %d/%d ready in %.1f s (ZeRO %d)", self.rank, self.world_size,
                    self.init_seconds, learner.zero_stage)

    def _build_engine(self, model_dir: str | Path) -> None:
        """The policy, its optimiser and lr schedule, wrapped by DeepSpeed (``self.model``, ``self.engine``,
        ``self.optimizer``, ``self.device``)."""
        import deepspeed
        from transformers import AutoModelForCausalLM

        learner = self.learner
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self._dtype)
        self.model.config.use_cache = False
        if learner.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # A torch optimiser: a DeepSpeed Adam in the config would JIT-build fused_adam (needs a compiler toolchain).
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=learner.lr, betas=learner.betas,
                                      weight_decay=learner.weight_decay)
        warmup = learner.lr_warmup_steps
        # DeepSpeed steps the scheduler with each optimiser step and keeps its state in checkpoints.
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=ResponseLogitsPolicy(self.model), optimizer=optimizer, lr_scheduler=schedule,
            config=self._deepspeed_config()
        )
        self.engine.train()
        self.device = self.engine.device

    def _load_reference(self, model_dir: str | Path) -> nn.Module:
        from transformers import AutoModelForCausalLM

        # A full frozen copy on every rank (not ZeRO-partitioned): fine at the sizes this lab trains.
        reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self._dtype).to(self.device).eval()
        reference.requires_grad_(False)
        return reference

    @property
    def _dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.learner.bf16 else torch.float32

    def _deepspeed_config(self) -> dict:
        cfg = self.learner
        return {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            # Nominal: train_step sets the accumulation boundary itself (groups may pack unevenly).
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
            "train_batch_size": cfg.micro_batch_size * cfg.gradient_accumulation_steps * self.world_size,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            "bf16": {"enabled": cfg.bf16},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }

    # ----------------------------------------------------------------------------- forward passes
    def _response_stats(self, batch: TrainBatch, index: ResponseIndex, logits: torch.Tensor):
        """logp (with grad), entropy, G (or None) in the [B, T] layout, from logits [N, V] at the response tokens."""
        stats = token_stats_from_logits(logits[None], index.tokens[None], self.temperature, self.with_grad_norm)
        layout = lambda flat: _to_layout(flat[0], index, batch.response_mask)
        grad_norm = None if stats.grad_norm is None else layout(stats.grad_norm)
        return layout(stats.logp), layout(stats.entropy), grad_norm

    @torch.no_grad()
    def compute_reference_stats(self, batch: TrainBatch, policy: bool = True) -> TrainBatch:
        """The batch with ``old_logp`` = log π (current weights) and, with a reference, ``ref_logp``.
        ``policy=False``: only ``ref_logp``; the batch keeps its own ``old_logp``.

        Batches live on the CPU; each micro-batch visits the engine's device for its forward.
        """
        batch = batch.to("cpu")
        old = torch.zeros(batch.response_mask.shape, device=self.device)
        ref = torch.zeros_like(old) if self.reference is not None else None
        self.engine.eval()
        try:
            for rows in torch.arange(batch.batch_size).split(self.learner.micro_batch_size):
                piece = batch.select(rows).to(self.device)
                index = piece.response_index()
                into = (rows.to(self.device)[index.rows], index.cols)
                if policy:
                    logits = self.engine(piece.input_ids, piece.attention_mask, index.rows, index.positions)
                    old[into] = self._flat_logp(logits, index)
                if ref is not None:
                    ref_logits = response_logits(self.reference, piece.input_ids, piece.attention_mask,
                                                 index.rows, index.positions)
                    ref[into] = self._flat_logp(ref_logits, index)
        finally:
            self.engine.train()
        return batch.replace(old_logp=old.cpu() if policy else batch.old_logp,
                             ref_logp=ref.cpu() if ref is not None else batch.ref_logp)

    @torch.no_grad()
    def token_statistics(self, batch: TrainBatch) -> list[dict[str, list[float] | float | int]]:
        """Per answer: each response token's entropy H, logits-gradient norm G = ‖e_o − p‖ and effective
        gradient coefficient ω at the current weights, with the answer's advantage and group — the data of
        the paper's entropy-vs-gradient figure and of the GMTS-score check (|ω|·G is the norm of the loss
        gradient with respect to the token's logits). One no-grad forward per micro-batch (and one of the
        reference with KL); a collective under ZeRO-3.

        ω is the policy loss's (``effective_grad_coef``) on-policy (π_old = π: the ratio the next update
        would start from), with its aggregation weight over this rank's shard; a token method's per-token
        terms (Archer, KL-Cov, shaped advantages) are not in it."""
        batch = batch.to("cpu")
        loss_config = self._loss_config_for(batch)
        weights = aggregation_weights(batch.response_mask, loss_config.loss_agg, loss_config.loss_agg_norm_length)
        answers: list[dict[str, list[float] | float | int]] = []
        self.engine.eval()
        try:
            for rows in torch.arange(batch.batch_size).split(self.learner.micro_batch_size):
                piece = batch.select(rows).to(self.device)
                index = piece.response_index()
                logits = self.engine(piece.input_ids, piece.attention_mask, index.rows, index.positions)
                stats = token_stats_from_logits(logits[None], index.tokens[None], self.temperature,
                                                with_grad_norm=True)
                logp = _to_layout(stats.logp[0], index, piece.response_mask)
                ref_logp = None
                if self.reference is not None:
                    ref_logits = response_logits(self.reference, piece.input_ids, piece.attention_mask,
                                                 index.rows, index.positions)
                    ref_logp = _to_layout(self._flat_logp(ref_logits, index), index, piece.response_mask)
                mask = piece.response_mask
                omega = effective_grad_coef(logp, logp, piece.advantages[:, None].expand_as(mask), mask, loss_config,
                                            ref_logp, include_aggregation_weight=False)
                omega = omega * weights[rows, :mask.shape[1]].to(omega.device)  # select() trims the width
                for row in range(piece.batch_size):
                    at_row = index.rows == row
                    answers.append({"entropy": stats.entropy[0][at_row].cpu().tolist(),
                                    "grad_norm": stats.grad_norm[0][at_row].cpu().tolist(),
                                    "omega": omega[row][mask[row].bool()].cpu().tolist(),
                                    "advantage": float(piece.advantages[row]),
                                    "group": int(piece.group_ids[row])})
        finally:
            self.engine.train()
        return answers

    def _flat_logp(self, logits: torch.Tensor, index: ResponseIndex) -> torch.Tensor:
        stats = token_stats_from_logits(logits[None], index.tokens[None], self.temperature)
        return stats.logp[0].float()

    # ------------------------------------------------------------------------------------ training
    def train_step(self, batch: TrainBatch, step: int) -> dict[str, float]:
        """PPO epochs over this rank's batch; returns metrics averaged over micro-batches (timings summed),
        except ``loss/total`` and ``loss/pg``: each mini-batch's one aggregate (its micro-batch losses weighted
        as in backward, so the value does not depend on how the mini-batch was cut), averaged over mini-batches."""
        started = time.perf_counter()
        batch = batch.to("cpu")  # scheduling on the CPU; micro-batches go to the device one at a time
        cfg = self.learner
        batch, agreement = self._with_reference_stats(batch)
        loss_config = self._loss_config_for(batch)
        self._warn_if_groups_are_cut(batch)
        timings: dict[str, float] = defaultdict(float)
        timings["reference_pass"] = time.perf_counter() - started
        records: list[dict[str, float]] = []
        optimizer_records: list[dict[str, float]] = []
        tokens: dict[str, int] = defaultdict(int)
        # π_old taken from the rollout: the engine–learner agreement is read off the first mini-batch's
        # forwards instead, which run at the weights the engine sampled with (no update yet this step).
        # A stale batch was sampled by other weights than these: its gap is the lag (policy/ratio_abs_dev), not the
        # numeric agreement of two implementations of one policy.
        measure_agreement = not agreement and batch.sampling_logp is not None and batch.old_logp is not None \
            and self.learner.old_logp_source == "rollout" and not batch.is_stale
        agreement_sums = [0.0, 0.0]  # Σ |sampling logp − logp| over response tokens, their count
        for epoch in range(cfg.ppo_epochs):
            shuffle = torch.Generator().manual_seed(_mix_seed(cfg.seed, step, epoch))
            minis = split_groups(batch, cfg.mini_batch_per_rank, generator=shuffle, split_large_groups=False)
            schedule = self._micro_batches(minis)
            unit_totals = self._global_unit_totals(schedule, loss_config)
            for micro in (m for micros in schedule for m in micros):
                tokens["padded"] += micro.attention_mask.numel()
                tokens["real"] += int(micro.attention_mask.sum())
            for mini_index, micros in enumerate(schedule):
                aggregate: dict[str, float] = defaultdict(float)
                seeds = (step, epoch, mini_index)
                selections, pg_total = self._select_before_backward(micros, loss_config, seeds, timings)
                for micro_index, micro in enumerate(micros):
                    self.engine.set_gradient_accumulation_boundary(micro_index == len(micros) - 1)
                    scale = loss_scale(micro.response_mask, loss_config.loss_agg, unit_totals[mini_index])
                    selection_rng = torch.Generator().manual_seed(
                        _mix_seed(self.selection.seed, *seeds, micro_index, self.rank))
                    # The tie-break order must be one draw on every rank (global scopes rank one population).
                    tie_seed = _mix_seed(self.selection.seed, *seeds, micro_index)
                    record = self._micro_step(
                        micro, loss_config, scale * self.world_size, selection_rng, tie_seed, timings,
                        selection=None if selections is None else selections[micro_index],
                        pg_total=pg_total, whole_mini_batch=len(micros) == 1,
                        agreement_sums=agreement_sums if measure_agreement and epoch == 0 and mini_index == 0 else None)
                    for key in MINI_BATCH_LOSSES:  # × world: the group reports the mean over ranks
                        aggregate[key] += record.pop(key) * scale * self.world_size
                    records.append(record)
                optimizer_records.append({**self._optimizer_record(), **aggregate})
        metrics = _step_metrics(records, optimizer_records, tokens, timings)
        metrics.update(agreement)
        if measure_agreement:
            metrics["rollout/logprob_diff"] = agreement_sums[0] / max(agreement_sums[1], 1.0)
        metrics["time/train_step_s"] = time.perf_counter() - started
        return metrics

    def _with_reference_stats(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        """The batch with π_old (and π_ref) from this rank's own no-grad pass when the schedule or KL needs
        them and the batch does not carry them; plus, when it carries the rollout's sampling logprobs, their
        mean absolute difference to the learner's π_old over the response tokens."""
        needs = needs_reference_pass(self.learner, batch.batch_size, self.loss.kl_coef)
        if batch.is_stale:
            # Sampled by older weights: π_old is the policy that sampled it, which only the engine recorded
            # (this rank's weights have moved on since), whatever the schedule.
            if self.learner.old_logp_source != "rollout":
                raise ValueError("a batch with staleness > 0 (rollout.max_staleness) needs "
                                 "learner.old_logp_source='rollout': its π_old is the engine's sampling logprobs")
            needs = True
        if needs and self.learner.old_logp_source == "rollout" and batch.old_logp is None:
            if batch.sampling_logp is None:
                raise ValueError("learner.old_logp_source='rollout': the batch carries no rollout logprobs "
                                 "(TrainBatch.sampling_logp)")
            batch = batch.replace(old_logp=batch.sampling_logp)
            if self.reference is not None and batch.ref_logp is None:
                batch = self.compute_reference_stats(batch, policy=False)
            return batch, {}  # the agreement is measured on the first mini-batch (train_step)
        if not needs or (batch.old_logp is not None and (self.reference is None or batch.ref_logp is not None)):
            return batch, {}
        batch = self.compute_reference_stats(batch)
        if batch.sampling_logp is None:
            return batch, {}
        mask = batch.response_mask
        diff = float(((batch.sampling_logp - batch.old_logp).abs() * mask).sum() / mask.sum().clamp(min=1))
        return batch, {"rollout/logprob_diff": diff}

    def _micro_batches(self, minis: list[TrainBatch]) -> list[list[TrainBatch]]:
        """Each mini-batch's micro-batches: ``micro_batch_size`` rows, or packed by the token budget — then
        as many per mini-batch on every rank as the busiest rank needs (forwards can be collectives)."""
        cfg = self.learner
        if cfg.max_tokens_per_micro_batch is None:
            return [split_groups(mini, cfg.micro_batch_size) for mini in minis]
        budget = cfg.max_tokens_per_micro_batch
        counts = [len(pack_by_tokens(mini, budget)) for mini in minis]
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, counts, group=self.process_group)
        needed = [max(rank_counts[i] for rank_counts in gathered) for i in range(len(minis))]
        return [pack_by_tokens(mini, budget, min_pieces=n) for mini, n in zip(minis, needed)]

    def _select_before_backward(self, micros: list[TrainBatch], loss_config: PolicyLossConfig,
                                seeds: tuple[int, ...], timings: dict[str, float]
                                ) -> tuple[list[Selection] | None, float | None]:
        """With scope mini_batch/global and several micro-batches: one no-grad scoring pass over the
        mini-batch, one selection over all its tokens (on every rank for global), cut back per micro-batch;
        and, for apply_to='loss', the selected-token units of the mini-batch summed over ranks."""
        if not needs_scoring_pass(self.selection, len(micros)):
            return None, None
        tick = time.perf_counter()
        parts = [self._token_scores(micro) for micro in micros]
        population = {key: stack_rows([part[key] for part in parts]) for key in parts[0]}
        mask = population.pop("response_mask")
        whole = select_tokens(
            response_mask=mask, config=self.selection, loss_config=loss_config, process_group=self.process_group,
            generator=torch.Generator().manual_seed(_mix_seed(self.selection.seed, *seeds, self.rank)),
            tie_seed=_mix_seed(self.selection.seed, *seeds), **population,
        )
        selections = [whole.rows(*span) for span in row_spans([part["response_mask"] for part in parts])]
        pg_total = None
        if self.selection.apply_to == "loss":
            pg_total = self._selected_units(selections, loss_config)
        timings["selection_scoring"] += time.perf_counter() - tick
        return selections, pg_total

    @torch.no_grad()
    def _token_scores(self, micro: TrainBatch) -> dict[str, torch.Tensor | None]:
        """What select_tokens reads of one micro-batch, at the current weights (a collective under ZeRO-3)."""
        micro = micro.to(self.device)
        index = micro.response_index()
        logits = self.engine(micro.input_ids, micro.attention_mask, index.rows, index.positions)
        logp, entropy, grad_norm = self._response_stats(micro, index, logits)
        return {"response_mask": micro.response_mask, "entropy": entropy, "advantages": micro.advantages,
                "group_ids": micro.group_ids, "logp": logp,
                "old_logp": micro.old_logp if micro.old_logp is not None else logp,
                "ref_logp": micro.ref_logp, "grad_norm": grad_norm}

    def _selected_units(self, selections: list[Selection], loss_config: PolicyLossConfig) -> float:
        """apply_to='loss': the policy-gradient term's denominator, the selected tokens' loss units of the whole
        mini-batch (these selections) summed over ranks."""
        return self._sum_over_ranks(sum(loss_units(s.mask.float(), loss_config.loss_agg) for s in selections))

    def _sum_over_ranks(self, value: float) -> float:
        total = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=self.process_group)
        return max(float(total), 1.0)

    def _micro_step(self, micro: TrainBatch, loss_config: PolicyLossConfig, scale: float,
                    generator: torch.Generator, tie_seed: int, timings: dict[str, float],
                    selection: Selection | None = None, pg_total: float | None = None,
                    whole_mini_batch: bool = False, agreement_sums: list[float] | None = None) -> dict[str, float]:
        """Forward, selection (unless given), loss, backward and optimiser step of one micro-batch; its metrics.
        ``agreement_sums``: add Σ |sampling logp − logp| and the token count of this micro-batch to it."""
        tick = time.perf_counter()
        micro = micro.to(self.device)
        fwd = self._forward(micro, loss_config, agreement_sums)
        tock = time.perf_counter()
        timings["forward"] += tock - tick

        if selection is None:
            selection = select_tokens(
                response_mask=fwd.mask, entropy=fwd.entropy, advantages=micro.advantages, group_ids=micro.group_ids,
                config=self.selection, loss_config=loss_config, logp=fwd.logp.detach(), old_logp=fwd.old_logp,
                ref_logp=micro.ref_logp, grad_norm=fwd.grad_norm, process_group=self.process_group,
                generator=generator, tie_seed=tie_seed,
            )
            if self.selection.apply_to == "loss" and whole_mini_batch:
                # This micro-batch is the whole mini-batch: its selection is every selection of the step.
                pg_total = self._selected_units([selection], loss_config)
        pg_scale = scale
        if self.selection.apply_to == "loss" and pg_total is not None:
            pg_scale = loss_units(selection.mask.float(), loss_config.loss_agg) / pg_total * self.world_size
        pg_mask, loss_mask = selection.loss_masks(self.selection.apply_to)
        terms = None if selection.terms is None else selection.terms.to(self.device)
        out = ppo_clip_loss(
            logp=fwd.logp, old_logp=fwd.old_logp, advantages=micro.advantages[:, None].expand_as(fwd.mask),
            response_mask=fwd.mask, config=loss_config, ref_logp=micro.ref_logp, pg_mask=pg_mask, loss_mask=loss_mask,
            entropy=fwd.entropy_in_loss, terms=terms,
        )
        tick = time.perf_counter()
        timings["selection_and_loss"] += tick - tock

        self.engine.backward(out.pg_term * pg_scale + out.reg_term * scale, scale_wrt_gas=False)
        tock = time.perf_counter()
        timings["backward"] += tock - tick
        if self.engine.is_gradient_accumulation_boundary():
            self._last_grad_norm = self._unclipped_grad_norm()
        self.engine.step()  # applies the update only at the accumulation boundary set by train_step
        timings["optimizer"] += time.perf_counter() - tock
        return self._micro_record(micro, fwd, out, selection, terms, pg_scale, scale, loss_config)

    def _forward(self, micro: TrainBatch, loss_config: PolicyLossConfig, agreement_sums: list[float] | None
                 ) -> _MicroForward:
        """The policy's forward pass over one micro-batch (on the device) and what the loss and selection read."""
        index = micro.response_index()
        logits = self.engine(micro.input_ids, micro.attention_mask, index.rows, index.positions)
        logp, entropy, grad_norm = self._response_stats(micro, index, logits)
        mask = micro.response_mask
        if agreement_sums is not None:
            agreement_sums[0] += float(((micro.sampling_logp - logp.detach()).abs() * mask).sum())
            agreement_sums[1] += float(mask.sum())
        entropy_in_loss = entropy
        if loss_config.entropy_coef > 0:  # the bonus needs the entropy with its graph
            entropy_in_loss = _to_layout(entropy_from_logits(logits, self.temperature), index, mask)
        return _MicroForward(logp=logp, entropy=entropy, grad_norm=grad_norm, mask=mask,
                             old_logp=micro.old_logp if micro.old_logp is not None else logp.detach(),
                             entropy_in_loss=entropy_in_loss)

    def _micro_record(self, micro: TrainBatch, fwd: _MicroForward, out, selection: Selection, terms,
                      pg_scale: float, scale: float, loss_config: PolicyLossConfig) -> dict[str, float]:
        """One micro-batch's metrics: its loss terms, how far it is off-policy, and what the selection kept."""
        record = {
            # Weighted so that train_step's scale-weighted sum is the mini-batch aggregate.
            "loss/total": float((out.pg_term * pg_scale + out.reg_term * scale).detach()) / scale,
            "loss/pg": float(out.pg_loss) * pg_scale / scale,
            "loss/clip_fraction_high": out.clip_fraction_high,
            "loss/clip_fraction_low": out.clip_fraction_low,
            "loss/clip_fraction_dual": out.dual_clip_fraction,
            "policy/approx_kl_old": out.approx_kl_old,
            "policy/entropy": float(out.entropy) if out.entropy is not None else math.nan,
        }
        if out.kl is not None:
            record["loss/kl"] = float(out.kl)
        record.update(self._off_policy_record(micro, fwd.logp.detach(), fwd.old_logp, fwd.entropy.detach(),
                                              loss_config))
        # On CPU copies: diagnostics builds its quantile levels on the CPU (and it is all [B, T]-sized).
        cpu = lambda t: None if t is None else t.detach().cpu()
        # The advantages the loss used: a shaping method's (entropy_adv) replace the batch's.
        advantages = micro.advantages if terms is None or terms.advantages is None else terms.advantages
        record.update(selection_diagnostics(
            Selection(mask=cpu(selection.mask), scores=cpu(selection.scores), eligible=cpu(selection.eligible),
                      treated=cpu(selection.treated)),
            cpu(fwd.mask), cpu(fwd.entropy), cpu(fwd.grad_norm), advantages=cpu(advantages),
            loss_agg=loss_config.loss_agg, apply_to=self.selection.apply_to,
            token_roles=cpu(micro.token_roles), role_legend=micro.role_legend))
        return record

    def _off_policy_record(self, micro: TrainBatch, logp: torch.Tensor, old_logp: torch.Tensor,
                           entropy: torch.Tensor, loss_config: PolicyLossConfig) -> dict[str, float]:
        """How far this micro-batch is off-policy and what that does to GMTS's ranking: mean |r − 1| over its
        response tokens, and how H·|ω| ranks its tokens against H·|A| (``omega_vs_advantage_ranking``). ω has the
        loss's ratio, clip state and KL term, no aggregation weight (as GMTS-release ranks) and no token method's
        per-token terms (Archer's clip ranges, KL-Cov's penalty): the lag's effect on GMTS's own score."""
        mask = micro.response_mask
        ratio_dev = ((logp - old_logp).exp() - 1).abs()
        record = {"policy/ratio_abs_dev": float((ratio_dev * mask).sum() / mask.sum().clamp(min=1))}
        advantages = micro.advantages[:, None].expand_as(mask)
        omega = effective_grad_coef(logp, old_logp, advantages, mask, loss_config, micro.ref_logp,
                                    include_aggregation_weight=False)
        ratio = self.selection.ratio if self.selection.ratio is not None else 1.0
        record.update(omega_vs_advantage_ranking(entropy.cpu(), omega.cpu(), advantages.cpu(), mask.cpu(),
                                                 micro.group_ids.cpu(), ratio))
        return record

    def _unclipped_grad_norm(self) -> float | None:
        # DeepSpeed's ZeRO and bf16 optimisers record the global norm in step(); its plain fp32 ZeRO-0
        # path clips without keeping it, so measure it here (gradients are already all-reduced).
        if self.learner.zero_stage > 0 or self.learner.bf16:
            return None
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads)) if grads else None

    def _optimizer_record(self) -> dict[str, float]:
        # The update itself ran inside the last micro-batch's engine.step(); read what it measured.
        grad_norm = self.engine.get_global_grad_norm()
        if grad_norm is None:
            grad_norm = self._last_grad_norm
        record = {"optim/lr": float(self.optimizer.param_groups[0]["lr"])}
        if grad_norm is not None:
            record["optim/grad_norm"] = float(grad_norm)
        return record

    def _warn_if_groups_are_cut(self, batch: TrainBatch) -> None:
        keeps_all = SELECTION_METHODS[self.selection.method].keeps_every_token
        if self.selection.scope != "group" or keeps_all or self._warned_group_split:
            return
        budget, lengths = self.learner.max_tokens_per_micro_batch, batch.attention_mask.sum(-1)
        if budget is None:
            size = max(len(rows) for rows in batch.groups())
            limit, unit = self.learner.micro_batch_size, "sequences"
        else:
            size = max(len(rows) * int(lengths[rows].max()) for rows in batch.groups())
            limit, unit = budget, "padded tokens"
        if size > limit:
            self._warned_group_split = True
            logger.warning(
                "a group of %d %s does not fit a micro-batch of %d: scope='group' selection ranks each "
                "micro-batch's part of the group separately (raise the limit for exact groups)", size, unit, limit)

    def _loss_config_for(self, batch: TrainBatch) -> PolicyLossConfig:
        # seq-mean-token-sum-norm divides by one constant length; without a configured one it is the
        # batch's T, fixed here so that the (trimmed) micro-batches all use the same constant.
        if self.loss.loss_agg == "seq-mean-token-sum-norm" and self.loss.loss_agg_norm_length is None:
            return self.loss.model_copy(update={"loss_agg_norm_length": batch.response_width})
        return self.loss

    def _global_unit_totals(self, schedule: list[list[TrainBatch]], loss_config: PolicyLossConfig) -> list[float]:
        """U per mini-batch summed over ranks; also checks that every rank runs the same schedule
        (a rank with one micro-batch more would wait forever in a collective)."""
        shape, units = schedule_units(schedule, loss_config.loss_agg)
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, (shape, units), group=self.process_group)
        shapes = [s for s, _ in gathered]
        if any(s != shapes[0] for s in shapes):
            raise ValueError(
                f"learner ranks would run different micro-batch schedules {shapes} (micro-batches per mini-batch, "
                "per rank); shard the batch into equal whole-group pieces (schedule.shard)"
            )
        return [max(sum(u[i] for _, u in gathered), 1.0) for i in range(len(schedule))]

    # ---------------------------------------------------------------------------- weights, checkpoints
    def weights_for_rollout(self) -> HostWeights:
        """:meth:`state_dict_for_inference` packed for the object store (empty on ranks other than 0)."""
        return HostWeights(self.state_dict_for_inference().items())

    def weight_sync_device(self) -> str | None:
        return local_device_key()

    def join_weight_sync_group(self, host: str, port: int, world_size: int, backend: str) -> None:
        """Rank 0 only: create the weight-sync group at its own address as rank 0 (the TCPStore master)."""
        self.weight_group = join_group(host, port, 0, world_size, backend)

    def broadcast_weights(self, bucket_bytes: int) -> int:
        """Rank 0 broadcasts the full weights to the rollout workers of the weight-sync group (the collective
        weight sync); returns the bytes sent. Every learner rank must call it (ZeRO-3 gathers first)."""
        with self._full_weights() as named:
            if self.rank != 0:
                return 0
            if self.weight_group is None:
                raise RuntimeError("broadcast_weights on rank 0 needs the weight-sync group (join it first)")
            return send_weights(self.weight_group, named, bucket_bytes)

    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        """Full weights with HF names (what vLLM's ``reload_weights`` takes) on rank 0; {} elsewhere.

        Under ZeRO-3 the parameters are gathered first, a collective: every rank must call this.
        """
        with self._full_weights() as named:
            return {name: tensor.detach().to("cpu", copy=True) for name, tensor in named}

    @contextmanager
    def _full_weights(self):
        """The model's full (name, tensor) list on rank 0, [] elsewhere; gathered under ZeRO-3."""
        import deepspeed

        gather = (deepspeed.zero.GatheredParameters(list(self.model.parameters()))
                  if self.learner.zero_stage == 3 else nullcontext())
        with gather:
            yield list(self.model.state_dict().items()) if self.rank == 0 else []

    def save_checkpoint(self, path: str | Path, client_state: dict | None = None) -> None:
        """Model, optimiser and engine counters (each rank writes its ZeRO partition) plus ``client_state``."""
        self.engine.save_checkpoint(str(path), tag=CHECKPOINT_TAG,
                                    client_state={CLIENT_STATE_KEY: dict(client_state or {})})

    def load_checkpoint(self, path: str | Path) -> dict:
        if not (Path(path) / CHECKPOINT_TAG).is_dir():
            raise FileNotFoundError(f"no learner checkpoint under {path} (expected {Path(path) / CHECKPOINT_TAG})")
        _, client_state = self.engine.load_checkpoint(str(path), tag=CHECKPOINT_TAG, load_optimizer_states=True)
        return client_state[CLIENT_STATE_KEY]  # DeepSpeed hands back its own entries too


def _to_layout(flat: torch.Tensor, index: ResponseIndex, like: torch.Tensor) -> torch.Tensor:
    """Scatter N per-token values into the [B, T] response layout (zeros elsewhere; keeps autograd)."""
    return torch.zeros(like.shape, dtype=flat.dtype, device=flat.device).index_put((index.rows, index.cols), flat)


def _step_metrics(records: list[dict[str, float]], optimizer_records: list[dict[str, float]], tokens: dict[str, int],
                  timings: dict[str, float]) -> dict[str, float]:
    """A step's metrics: the micro-batches' and optimiser steps' means, their counts, padding and phase times."""
    metrics = _mean_metrics(records)
    metrics.update(_mean_metrics(optimizer_records))
    metrics["optim/steps"] = float(len(optimizer_records))
    metrics["learner/micro_batches"] = float(len(records))
    metrics["learner/padding_fraction"] = 1.0 - tokens["real"] / max(tokens["padded"], 1)
    metrics.update({f"time/{phase}_s": seconds for phase, seconds in timings.items()})
    return metrics


def _mix_seed(*parts: int) -> int:
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + int(part)) % (2**63 - 1)
    return seed


def _mean_metrics(records: list[dict[str, float]]) -> dict[str, float]:
    """Per-key mean over the records that have the key, ignoring NaN (e.g. Spearman of 1-token answers)."""
    values: dict[str, list[float]] = defaultdict(list)
    for record in records:
        for key, value in record.items():
            if not math.isnan(value):
                values[key].append(value)
    return {key: sum(v) / len(v) for key, v in values.items()}
