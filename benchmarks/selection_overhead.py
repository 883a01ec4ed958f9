"""Selection overhead: what token scores + selection cost next to the learner's own step.

For one realistic micro-batch per model, measured side by side in one run:

- ``step/baseline``: the learner's forward + backward with the plain policy loss — logits at the
  response positions only (``forward.response_logits``), log π by log-softmax + gather,
  ``ppo_clip_loss``, backward. Nothing is computed for selection. (No optimiser step: leaving it
  out makes the denominator smaller, so the overhead ratios below are upper bounds.)
- the *isolated* cost of each method's extra work on the same logits: the entropy (and G) that
  ``token_stats_from_logits`` adds on top of log π (its time minus a log-softmax + gather), plus
  ``select_tokens`` (which calls ``effective_grad_coef`` for the gmts methods). Overhead =
  (scores + selection) / baseline step. This is the precise figure (target ≤ 3 % at SmolLM2 scale).
- ``step/<method>``: the whole micro-step with that method's scores, selection and masked loss,
  against ``step/baseline`` (the same thing measured end to end; noisier, a difference of two
  large numbers).
- the released GMTS code's way: an extra no-grad forward per mini-batch to get the scores
  (``released_forward``), and its whole step (extra forward + the gmts step), as ratios.
- forward passes counted per micro-batch: our step (expected 1), the released way (2), and one
  ``LearnerEngine.train_step`` whose mini-batch is one micro-batch (expected 1).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from benchmarks.report import BenchmarkResult, Figure
from benchmarks.timing import Samples, interleaved, paired_ratio
from orchestrator.config import ExperimentConfig
from orchestrator.config_loader import load_experiment
from workers.learner.batch import TrainBatch
from workers.learner.forward import response_logits
from workers.learner.losses import PolicyLossConfig, ppo_clip_loss
from workers.learner.selection import SelectionConfig, select_tokens
from workers.learner.token_stats import token_stats_from_logits
from workers.models.materialize import materialize_model

logger = logging.getLogger(__name__)

METHODS = ("ets", "gmts", "gmts_exact")


@dataclass(frozen=True)
class Scale:
    """One model at one micro-batch shape, taken from a preset."""

    label: str
    preset: str
    rows: int
    prompt_tokens: int
    response_tokens: int
    group_size: int
    rounds: int  # interleaved rounds of the big steps
    inner_rounds: int  # rounds of the isolated (small) cases per outer round
    repeat: int = 1  # calls per timed sample (tiny steps last milliseconds: time a block of them)
    warmup: int = 1


def scales(smoke: bool) -> list[Scale]:
    tiny = load_experiment("cpu-tiny-s")
    if smoke:
        return [
            # One timed round after the warm-up round: every case still runs, and each call is preceded by a
            # gc.collect() that costs more than the tiny step itself.
            Scale("tiny-s", "cpu-tiny-s", 16, tiny.rollout.max_prompt_tokens, tiny.rollout.max_new_tokens,
                  tiny.rollout.n_samples, rounds=1, inner_rounds=1),
            Scale("smollm2-135m", "cpu-smollm2", 1, 8, 24, 1, rounds=1, inner_rounds=1, warmup=0),
        ]
    return [
        # The tiny model's realistic micro-batch is the one its preset trains with.
        Scale("tiny-s", "cpu-tiny-s", tiny.learner.micro_batch_size, tiny.rollout.max_prompt_tokens,
              tiny.rollout.max_new_tokens, tiny.rollout.n_samples, rounds=15, inner_rounds=3, repeat=5),
        # SmolLM2 (vocab 49k): 8 sequences × 512 tokens (128 prompt + 384 response), the size.
        Scale("smollm2-135m", "cpu-smollm2", 8, 128, 384, 4, rounds=4, inner_rounds=3),
    ]


def run(smoke: bool) -> dict:
    torch.manual_seed(0)
    figures: list[Figure] = []
    measurements: dict = {}
    settings: dict = {"torch_threads": torch.get_num_threads(), "methods": list(METHODS),
                      "optimizer_step": "not included (the overhead ratios are upper bounds)"}
    for scale in scales(smoke):
        config = load_experiment(scale.preset)
        bench = _MicroBatchBench(scale, config)
        samples = bench.measure()
        figures += bench.figures(samples)
        settings[scale.label] = bench.settings(samples)
        measurements[scale.label] = samples.summary()
        del bench
    forwards = count_forward_passes(smoke)
    figures += forwards["figures"]
    measurements["forward_counts"] = forwards["counts"]
    notes = [
        ("overhead (isolated) = (entropy/G on top of log π + select_tokens) / baseline fwd+bwd step; "
         "in-step = paired median of step(method)/step(baseline) − 1."),
        "released GMTS way = one extra no-grad forward (+ entropy) per mini-batch before the step.",
        f"LearnerEngine forward count: {forwards['engine_status']}",
    ]
    return BenchmarkResult(
        title="token scores + selection vs the learner's forward+backward",
        settings=settings, figures=figures, measurements=measurements, notes=notes,
    ).as_dict()


class _MicroBatchBench:
    def __init__(self, scale: Scale, config: ExperimentConfig):
        self.scale = scale
        self.temperature = config.rollout.temperature
        self.loss_config: PolicyLossConfig = config.algorithm.loss
        self.base_selection: SelectionConfig = config.selection
        self.model_dir = materialize_model(config.model)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.model.config.use_cache = False
        self.model.train()
        self.vocab = self.model.get_output_embeddings().weight.shape[0]
        self.batch = self._random_batch()
        self.index = self.batch.response_index()
        self.mask = self.batch.response_mask
        self.adv = self.batch.advantages[:, None].expand_as(self.mask)
        with torch.no_grad():  # fixed logits for the isolated cases
            self.logits = self._logits()
            stats = token_stats_from_logits(self.logits[None], self.index.tokens[None], self.temperature, True)
            self.stats = {name: self._layout(getattr(stats, name)[0]) for name in ("logp", "entropy", "grad_norm")}

    # ----------------------------------------------------------------------------------- the data
    def _random_batch(self) -> TrainBatch:
        s = self.scale
        gen = torch.Generator().manual_seed(0)
        low = 3 if self.vocab < 100 else 0  # tiny: skip <pad>/<bos>/<eos>
        prompts = torch.randint(low, self.vocab, (s.rows, s.prompt_tokens), generator=gen).tolist()
        responses = torch.randint(low, self.vocab, (s.rows, s.response_tokens), generator=gen).tolist()
        groups = [row // s.group_size for row in range(s.rows)]
        batch = TrainBatch.from_lists(prompts, responses, torch.randn(s.rows, generator=gen), groups, pad_id=0)
        with torch.no_grad():
            index = batch.response_index()
            logits = response_logits(self.model, batch.input_ids, batch.attention_mask, index.rows, index.positions)
            logp = token_stats_from_logits(logits[None], index.tokens[None], self.temperature).logp[0]
        # π_old and π_ref near π, so that some ratios clip and the KL term is non-zero, as in training.
        noise = lambda: 0.1 * torch.randn(logp.shape, generator=gen)
        old = self._scatter(batch, index, logp + noise())
        ref = self._scatter(batch, index, logp + noise())
        return batch.replace(old_logp=old, ref_logp=ref)

    @staticmethod
    def _scatter(batch: TrainBatch, index, flat: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(batch.response_mask)
        out[index.rows, index.cols] = flat
        return out

    def _layout(self, flat: torch.Tensor | None) -> torch.Tensor | None:
        if flat is None:
            return None
        return torch.zeros(self.mask.shape, dtype=flat.dtype).index_put((self.index.rows, self.index.cols), flat)

    def _logits(self) -> torch.Tensor:
        b, i = self.batch, self.index
        return response_logits(self.model, b.input_ids, b.attention_mask, i.rows, i.positions)

    def _selection_config(self, method: str) -> SelectionConfig:
        return self.base_selection.model_copy(update={"method": method, "ratio": self.base_selection.ratio or 0.2})

    # ----------------------------------------------------------------------------------- the cases
    def _loss_and_backward(self, logp: torch.Tensor, pg_mask=None, loss_mask=None) -> None:
        out = ppo_clip_loss(logp=logp, old_logp=self.batch.old_logp, advantages=self.adv, response_mask=self.mask,
                            config=self.loss_config, ref_logp=self.batch.ref_logp, pg_mask=pg_mask,
                            loss_mask=loss_mask)
        out.loss.backward()

    def step_baseline(self, pg_mask=None) -> None:
        """The learner's fwd+bwd with nothing computed for selection."""
        self.model.zero_grad(set_to_none=True)
        logp = self._layout(_logp_only(self._logits(), self.index.tokens, self.temperature))
        self._loss_and_backward(logp, pg_mask=pg_mask)

    def step_with(self, method: str) -> None:
        """Our learner's micro-step: scores from the same logits as the loss, then the masked loss."""
        self.model.zero_grad(set_to_none=True)
        logits = self._logits()
        stats = token_stats_from_logits(logits[None], self.index.tokens[None], self.temperature,
                                        with_grad_norm=method == "gmts_exact")
        logp, entropy = self._layout(stats.logp[0]), self._layout(stats.entropy[0])
        grad_norm = self._layout(stats.grad_norm[0]) if stats.grad_norm is not None else None
        selection = self._select(method, logp.detach(), entropy, grad_norm)
        pg_mask, loss_mask = selection.loss_masks(self.base_selection.apply_to)
        self._loss_and_backward(logp, pg_mask=pg_mask, loss_mask=loss_mask)

    def released_forward(self):
        """The released GMTS code's extra pass: a no-grad forward for entropy, then the scores."""
        with torch.no_grad():
            logits = self._logits()
            stats = token_stats_from_logits(logits[None], self.index.tokens[None], self.temperature)
            return self._select("gmts", self._layout(stats.logp[0]), self._layout(stats.entropy[0]), None)

    def step_released(self) -> None:
        selection = self.released_forward()
        self.step_baseline(pg_mask=selection.mask.float())

    def _select(self, method: str, logp, entropy, grad_norm):
        return select_tokens(response_mask=self.mask, entropy=entropy, advantages=self.batch.advantages,
                             group_ids=self.batch.group_ids, config=self._selection_config(method),
                             loss_config=self.loss_config, logp=logp, old_logp=self.batch.old_logp,
                             ref_logp=self.batch.ref_logp, grad_norm=grad_norm)

    def isolated_cases(self) -> dict[str, Callable[[], object]]:
        logits, tokens, t = self.logits, self.index.tokens, self.temperature
        s = self.stats
        cases: dict[str, Callable[[], object]] = {
            "iso/logp_only": lambda: _logp_only(logits, tokens, t),
            "iso/stats_entropy": lambda: token_stats_from_logits(logits[None], tokens[None], t),
            "iso/stats_entropy_G": lambda: token_stats_from_logits(logits[None], tokens[None], t, True),
        }
        for method in METHODS:
            grad_norm = s["grad_norm"] if method == "gmts_exact" else None
            cases[f"iso/select_{method}"] = (
                lambda m=method, g=grad_norm: self._select(m, s["logp"], s["entropy"], g))
        return cases

    def step_cases(self) -> dict[str, Callable[[], object]]:
        cases: dict[str, Callable[[], object]] = {"step/baseline": self.step_baseline}
        for method in METHODS:
            cases[f"step/{method}"] = lambda m=method: self.step_with(m)
        cases["step/released_gmts"] = self.step_released
        cases["released_forward"] = self.released_forward
        return cases

    def measure(self) -> Samples:
        """Seconds per call of every case: each outer round times every step once, then the isolated
        cases ``inner_rounds`` times; every sample is a block of ``repeat`` calls, divided back."""
        s = self.scale
        logger.info("selection_overhead %s: %d×(%d+%d) tokens, %d rounds", s.label, s.rows, s.prompt_tokens,
                    s.response_tokens, s.rounds)
        steps, iso = _repeated(self.step_cases(), s.repeat), _repeated(self.isolated_cases(), s.repeat)
        samples = Samples(seconds={name: [] for name in (*steps, *iso)}, rounds=s.rounds, warmup=s.warmup)
        if s.warmup:
            interleaved({**steps, **iso}, rounds=s.warmup, warmup=0)  # discarded
        for round_index in range(s.rounds):
            logger.info("selection_overhead %s: round %d/%d", s.label, round_index + 1, s.rounds)
            for part in (interleaved(steps, rounds=1, warmup=0, first_round=round_index),
                         interleaved(iso, rounds=s.inner_rounds, warmup=0, first_round=round_index)):
                for name, values in part.seconds.items():
                    samples.seconds[name].extend(v / s.repeat for v in values)
        return samples

    # ------------------------------------------------------------------------------------ figures
    def figures(self, samples: Samples) -> list[Figure]:
        label = self.scale.label
        base = samples.median("step/baseline")
        out: list[Figure] = []
        for method in METHODS:
            stats_case = "iso/stats_entropy_G" if method == "gmts_exact" else "iso/stats_entropy"
            scores = max(0.0, samples.median(stats_case) - samples.median("iso/logp_only"))
            select = samples.median(f"iso/select_{method}")
            out.append(Figure(f"{label}: {method} scores+selection / fwd+bwd (isolated)", 100 * (scores + select) / base,
                              "%", f"scores {scores * 1e3:.1f} ms + select {select * 1e3:.1f} ms vs step "
                              f"{base * 1e3:.0f} ms"))
        for method in METHODS:
            out.append(Figure(f"{label}: {method} step / baseline step − 1 (in-step)",
                              100 * (paired_ratio(samples, f"step/{method}", "step/baseline") - 1), "%",
                              f"paired median over {len(samples.seconds['step/baseline'])} rounds"))
        out.append(Figure(f"{label}: released extra no-grad forward / fwd+bwd",
                          100 * samples.median("released_forward") / base, "%",
                          f"{samples.median('released_forward') * 1e3:.0f} ms per mini-batch"))
        out.append(Figure(f"{label}: released-way step / our gmts step",
                          paired_ratio(samples, "step/released_gmts", "step/gmts"), "×",
                          "extra forward + gmts selection + step, vs scores from the step's own logits"))
        return out

    def settings(self, samples: Samples) -> dict:
        s = self.scale
        return {
            "preset": s.preset, "model_dir": str(self.model_dir), "vocab": self.vocab,
            "micro_batch": f"{s.rows} × ({s.prompt_tokens} prompt + {s.response_tokens} response) tokens",
            "response_tokens_total": int(self.mask.sum()), "group_size": s.group_size,
            "loss": self.loss_config.model_dump(), "selection": self._selection_config("gmts").model_dump(),
            "repetitions": {"steps": len(samples.seconds["step/baseline"]),
                            "isolated": len(samples.seconds["iso/logp_only"]), "calls_per_sample": s.repeat,
                            "warmup_rounds": s.warmup},
        }


def _logp_only(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log π of the tokens and nothing else: what the loss needs (as token_stats does it, minus entropy and G)."""
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def _repeated(cases: dict[str, Callable[[], object]], times: int) -> dict[str, Callable[[], object]]:
    if times == 1:
        return cases
    return {name: (lambda fn=fn: [fn() for _ in range(times)]) for name, fn in cases.items()}


# ------------------------------------------------------------------------------ forward counting
class _ForwardCounter:
    """Counts calls of a model's decoder (one per forward pass of the model)."""

    def __init__(self, causal_lm: torch.nn.Module):
        self.count = 0
        self._handle = causal_lm.get_decoder().register_forward_hook(self._hook)

    def _hook(self, *_):
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


def count_forward_passes(smoke: bool) -> dict:
    """Forward passes per micro-batch: our step, the released way, and LearnerEngine.train_step."""
    scale = scales(True)[0]  # counting needs no size
    bench = _MicroBatchBench(scale, load_experiment(scale.preset))
    counts: dict[str, int] = {}
    for name, fn in (("own_step_gmts", lambda: bench.step_with("gmts")), ("released_step", bench.step_released)):
        counter = _ForwardCounter(bench.model)
        fn()
        counts[name] = counter.count
        counter.close()
    figures = [
        Figure("forward passes per micro-batch: our gmts step", counts["own_step_gmts"], "",
               "scores from the loss's own logits"),
        Figure("forward passes per micro-batch: released GMTS way", counts["released_step"], ""),
    ]
    try:
        engine_counts = _count_in_learner_engine(bench)
        counts.update(engine_counts)
        status = "measured"
        figures.append(Figure("forward passes in one LearnerEngine.train_step (mini-batch = 1 micro-batch)",
                              engine_counts["engine_train_step"], "",
                              f"method gmts; micro-batches: {engine_counts['engine_micro_batches']}"))
    except Exception as exc:  # noqa: BLE001 - the learner may not be ready; the own-step count stands
        status = f"not measured ({type(exc).__name__}: {exc})"
        logger.warning("LearnerEngine forward count unavailable: %s", exc)
    return {"counts": counts, "figures": figures, "engine_status": status}


def _count_in_learner_engine(bench: _MicroBatchBench) -> dict[str, int]:
    import torch.distributed as dist

    from workers.learner.config import LearnerConfig
    from workers.learner.engine import LearnerEngine, init_process_group

    rows = bench.batch.batch_size
    learner = LearnerConfig(mini_batch_size=rows, micro_batch_size=rows, ppo_epochs=1)
    started_here = not dist.is_initialized()
    if started_here:
        init_process_group(0, 1, "127.0.0.1", _free_port())
    try:
        engine = LearnerEngine(bench.model_dir, learner, bench.loss_config, bench._selection_config("gmts"),
                               temperature=bench.temperature, use_reference=bench.loss_config.kl_coef > 0)
        counter = _ForwardCounter(engine.model)
        engine.train_step(bench.batch, step=1)
        counter.close()
        return {"engine_train_step": counter.count, "engine_micro_batches": 1}
    finally:
        if started_here and dist.is_initialized():
            dist.destroy_process_group()
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(name, None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
