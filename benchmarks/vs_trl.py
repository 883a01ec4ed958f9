"""End-to-end GRPO iteration time: gmts-lab's loop vs TRL's ``GRPOTrainer`` on the same job, CPU.

Same policy (the preset's model after its cached supervised warm-up), same training prompts, same
generations per prompt, same max completion length, same sampling (temperature, top-k off, top-p 1),
same ETS top-20 % (TRL: ``top_entropy_quantile=0.2``; ours: the ``ets-trl`` recipe, ratio 0.2 — TRL's
quantile threshold over the gathered micro-batch, ties kept; it masks the policy-gradient term and keeps
the denominator),
same loss (DAPO token-mean aggregation = TRL's default ``loss_type="dapo"``; no KL = TRL's default
``beta=0``; clip ε 0.2), same advantages (group-std-normalised = ``scale_rewards="group"``), same
optimiser (AdamW, the preset's lr/betas/weight decay, grad-norm clip, constant schedule: our side is
pinned to ``learner.lr_warmup_steps=0`` because the preset's linear warm-up is not TRL's
``constant_with_warmup`` step for step), same reward code (our ``RewardScorer`` is TRL's reward
function), and the same batch layout as the preset's RL step, whatever it is: one iteration = one
generation batch of prompts_per_step × n sequences (TRL: ``steps_per_generation`` = those sequences
÷ the micro-batch), trained in optimiser steps of ``mini_batch_size`` sequences (TRL: per-device
batch = our micro-batch, gradient accumulation = micro-batches per mini-batch). With cpu-tiny-s
(128 prompts × 8, mini-batch 256) that is 4 optimiser steps per iteration on both sides, and both
sides then compute π_old with one extra no-grad forward over the batch (TRL does so whenever an
iteration holds more than one optimiser step). The run checks that both sides took the same number
of optimiser steps per iteration and records it.

TRL runs in this process with its own generation (transformers ``generate``); we run
``train()`` on an embedded Ray (vLLM rollout actor + DeepSpeed learner actor + reward actor).
TRL is one process and may use both cores, so it runs at 1 and at 2 torch threads; at tiny scale our
side runs at the preset's threads, with learner and engine at 2, and at 2 with π_old taken from the
engine's sampling logprobs (``learner.old_logp_source=rollout``, no π_old forward) and the engine's GEMM on
unpacked weights (``rollout.cpu_linear=torch``) (``Scale.our_variants``). The ratio
is taken between each side's faster setting. Runs alternate (ours, TRL, …) with the order rotated each
round; each run's first iteration is dropped; seconds per iteration are medians over the rest. A TRL
iteration is timed from the end of the previous iteration's last optimiser step to the end of its own
last one (generation, scoring, the π_old forward and all its optimiser steps).
"""

from __future__ import annotations

import itertools
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from benchmarks.ray_session import start_local_ray
from benchmarks.report import BenchmarkResult, Figure, require_modules
from benchmarks.training_runs import LoopRun, require_loop, run_loop, step_breakdown

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scale:
    label: str
    preset: str
    steps: int
    rounds: int
    trl_threads: tuple[int, ...]
    extra: tuple[str, ...] = ()
    # Our settings besides the preset's own ("ours"), each a name and its overrides: like TRL, our side is
    # measured at its thread counts and the ratio taken against its faster one.
    our_variants: tuple[tuple[str, tuple[str, ...]], ...] = ()


def scales(smoke: bool) -> list[Scale]:
    if smoke:
        return [Scale("tiny-s", "cpu-tiny-s", steps=2, rounds=1, trl_threads=(1,),
                      extra=("warmup.enabled=false", "data.prompts_per_step=8", "learner.mini_batch_size=64",
                             "learner.micro_batch_size=64", "data.eval.arithmetic.limit=8", "data.eval.arithmetic_val.limit=8"))]
    return [
        # cpu-tiny-s computes at 1 learner thread (its accuracies were measured so); at 2 the learner uses both
        # cores as TRL's 2-thread process does (the loop runs rollout and learner one after the other).
        Scale("tiny-s", "cpu-tiny-s", steps=10, rounds=2, trl_threads=(1, 2),
              extra=("data.eval.arithmetic.limit=32", "data.eval.arithmetic_val.limit=32",),
              our_variants=(("ours_t2", ("learner.threads_per_actor=2", "rollout.threads_per_actor=2")),
                            # π_old from the engine's logprobs instead of a learner forward (as verl and
                            # NeMo-RL can), and the engine's GEMM on unpacked weights (no oneDNN re-pack
                            # after each weight sync): both documented options, other bits than the preset.
                            ("ours_t2_fast", ("learner.threads_per_actor=2", "rollout.threads_per_actor=2",
                                              "learner.old_logp_source=rollout", "rollout.cpu_linear=torch")),
                            # The engines roll out the next step's batch while the learner trains (one core
                            # each, so the two do not fight over threads); one version behind.
                            ("ours_ahead1", ("learner.old_logp_source=rollout", "rollout.cpu_linear=torch",
                                             "rollout.max_staleness=1")))),
        # ≈ 20-40 s per iteration: 8 iterations per run, 7 steady ones per side (the first pays one-time costs).
        Scale("smollm2-135m", "cpu-smollm2", steps=8, rounds=1, trl_threads=(1, 2),
              extra=("data.eval.gsm8k.limit=2",),
              our_variants=(("ours_ahead1", ("learner.old_logp_source=rollout", "rollout.max_staleness=1")),
                            # Overlapped, the preset's 2 + 2 threads oversubscribe the 2 cores: the engine at 1.
                            ("ours_ahead1_r1", ("learner.old_logp_source=rollout", "rollout.max_staleness=1",
                                                "rollout.threads_per_actor=1")))),
    ]


def selected_scales(smoke: bool) -> list[Scale]:
    """``GMTS_VS_TRL_SCALES=tiny-s,smollm2-135m`` (labels, comma-separated) runs only those; unset: all."""
    wanted = [label for label in os.environ.get("GMTS_VS_TRL_SCALES", "").split(",") if label]
    every = scales(smoke)
    unknown = set(wanted) - {scale.label for scale in every}
    if unknown:
        raise ValueError(f"GMTS_VS_TRL_SCALES: unknown scale(s) {sorted(unknown)}; "
                         f"known: {[scale.label for scale in every]}")
    return [scale for scale in every if not wanted or scale.label in wanted]


# Our side of the parity (see the module docstring); TRL's side is in _trl_args.
PARITY_OVERRIDES = (
    "selection.recipe=ets-trl", "selection.ratio=0.2",
    "algorithm.loss.kl_coef=0", "algorithm.loss.loss_agg=token-mean", "algorithm.loss.clip_low=0.2",
    "algorithm.loss.clip_high=0.2", "algorithm.advantage_estimator=grpo", "algorithm.dynamic_sampling=false",
    "algorithm.overlong.enabled=false", "learner.ppo_epochs=1", "learner.lr_warmup_steps=0",
)


def run(smoke: bool) -> dict:
    require_loop()
    require_modules("trl")
    import ray

    figures: list[Figure] = []
    settings: dict = {}
    measurements: dict = {}
    chosen = selected_scales(smoke)
    start_local_ray()
    try:
        for scale in chosen:
            result = _compare(scale)
            figures += result["figures"]
            settings[scale.label] = result["settings"]
            measurements[scale.label] = result["measurements"]
    finally:
        ray.shutdown()
    return BenchmarkResult(
        title="GRPO iteration time: gmts-lab (Ray + vLLM + DeepSpeed) vs TRL GRPOTrainer, same job, CPU",
        settings=settings, figures=figures, measurements=measurements,
        notes=["ratio > 1: gmts-lab is faster (TRL seconds per iteration / ours).",
               ("our time split comes from the loop's time/* metrics: rollout, reward, learner "
                "(time/train_step_s inside the learner actor), sync (weights to vLLM), overhead = the rest "
                "(Ray calls, batching, advantages, and the learner's π_old forward when an iteration holds "
                "several optimiser steps). With rollout.max_staleness ≥ 1 rollout and learner overlap: their "
                "shares are each side's busy share of the step and may add up to more than 100 %, the overhead "
                "then negative.")],
    ).as_dict()


def _compare(scale: Scale) -> dict:
    from orchestrator.base_policy import prepare_policy
    from orchestrator.config_loader import load_experiment

    overrides = list(PARITY_OVERRIDES) + list(scale.extra)
    config = load_experiment(scale.preset, overrides)
    policy_dir = prepare_policy(config)  # cached: the same starting policy for both sides
    variants = {"ours": (), **dict(scale.our_variants)}
    cases = list(variants) + [f"trl_t{t}" for t in scale.trl_threads]
    runs: dict[str, list[LoopRun]] = {case: [] for case in variants}
    trl: dict[str, list[float]] = {f"trl_t{t}": [] for t in scale.trl_threads}
    trl_info: dict = {}
    for round_index in range(scale.rounds):
        shift = round_index % len(cases)
        for case in cases[shift:] + cases[:shift]:
            if case in variants:
                runs[case].append(run_loop(scale.preset, overrides + list(variants[case]), scale.steps))
            else:
                seconds, trl_info = _run_trl(config, policy_dir, scale.steps, int(case.removeprefix("trl_t")))
                trl[case].extend(seconds[1:])  # the first iteration pays one-time costs
    our_steps = {case: [step["time/step"] for run in done for step in run.steady_steps()]
                 for case, done in runs.items()}
    our_optim_steps = sorted({step.get("optim/steps") for done in runs.values() for run in done
                              for step in run.history})
    if our_optim_steps != [trl_info["optimiser_steps_per_iteration"]]:
        raise RuntimeError(f"not the same job: our iterations took {our_optim_steps} optimiser steps, "
                           f"TRL's {trl_info['optimiser_steps_per_iteration']}")
    our_medians = {case: statistics.median(values) for case, values in our_steps.items()}
    ours_best = min(our_medians, key=our_medians.get)
    our_median = our_medians[ours_best]
    ours = runs[ours_best]
    trl_medians = {case: statistics.median(values) for case, values in trl.items()}
    best = min(trl_medians, key=trl_medians.get)
    label = scale.label
    figures = [Figure(f"{label}: TRL s/iter ÷ gmts-lab s/iter (each side at its faster setting: TRL {best}, "
                      f"ours {ours_best})", trl_medians[best] / our_median, "×",
                      f"ours {our_median:.2f} s/iter, TRL {trl_medians[best]:.2f} s/iter")]
    figures += [Figure(f"{label}: TRL ({case}) s/iter ÷ gmts-lab ({ours_best}) s/iter",
                       trl_medians[case] / our_median, "×", f"{trl_medians[case]:.2f} s/iter")
                for case in trl_medians if case != best]
    figures += [Figure(f"{label}: TRL ({best}) s/iter ÷ gmts-lab ({case}) s/iter", trl_medians[best] / value, "×",
                       f"ours ({case}) {value:.2f} s/iter")
                for case, value in our_medians.items() if case != ours_best]
    breakdown = step_breakdown([step for run in ours for step in run.steady_steps()])
    for phase in ("rollout", "reward", "learner", "sync", "overhead"):
        value = breakdown.get(phase)
        figures.append(Figure(f"{label}: gmts-lab time share {phase}",
                              None if value is None else 100 * value / breakdown["step"], "%",
                              "" if value is None else f"median {value:.3f} s; median step {breakdown['step']:.3f} s"))
    return {
        "figures": figures,
        "settings": {
            "preset": scale.preset, "policy_dir": str(policy_dir), "our_overrides": overrides,
            "steps_per_run": scale.steps, "rounds": scale.rounds,
            "our_variants": {case: list(extra) for case, extra in variants.items()}, "ours_best": ours_best,
            "steady_iterations": {**{c: len(v) for c, v in our_steps.items()}, **{c: len(v) for c, v in trl.items()}},
            "prompts_per_iteration": config.data.prompts_per_step, "generations_per_prompt": config.rollout.n_samples,
            "max_new_tokens": config.rollout.max_new_tokens, "lr": config.learner.lr,
            "mini_batch_size": config.learner.mini_batch_size, "micro_batch_size": config.learner.micro_batch_size,
            "our_optimiser_steps_per_iteration": our_optim_steps[0],
            "learner_threads_per_actor": config.learner.threads_per_actor, **trl_info,
        },
        "measurements": {"ours_s_per_iter": our_steps, "trl_s_per_iter": trl, "ours_breakdown_of": ours_best,
                         "ours_breakdown_per_run": [run.breakdown() for run in ours],
                         "ours_steady_steps": [{k: v for k, v in step.items() if k.startswith("time/")}
                                               for run in ours for step in run.steady_steps()]},
    }


# ------------------------------------------------------------------------------------------- TRL
def _run_trl(config, policy_dir, steps: int, threads: int) -> tuple[list[float], dict]:
    """Seconds per TRL iteration (one generation batch + one optimiser step), and the settings used."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from workers.models.char_tokenizer import load_tokenizer
    from trl import GRPOTrainer

    from orchestrator.data import chat_messages, load_dataset, prompt_token_ids
    from workers.reward.scorer import RewardScorer

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(policy_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    problems = load_dataset(config.data.train)
    template = config.data.prompt_template
    our_ids = [prompt_token_ids(p, tokenizer, template) for p in problems[:4]]
    if template.kind == "chat":  # TRL renders the same messages with the same chat template
        prompts = [chat_messages(p, template) for p in problems]
    else:  # the exact token ids we use, as text (special tokens included, e.g. <bos>)
        prompts = [tokenizer.decode(prompt_token_ids(p, tokenizer, template), skip_special_tokens=False)
                   for p in problems]
    dataset = Dataset.from_list([{"prompt": prompt, "problem_index": i} for i, prompt in enumerate(prompts)])

    clock = _StepClock()
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as out_dir, RewardScorer(config.reward) as scorer:
        def reward(prompts, completions, problem_index, **_):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [r.score for r in scorer.score(texts, [problems[i] for i in problem_index])]

        layout = _batch_layout(config)
        args = _trl_args(config, out_dir, steps * layout["optimiser_steps_per_iteration"], layout)
        model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[clock])
        trl_ids = trainer._tokenize_prompts(prompts[:4])[0] if hasattr(trainer, "_tokenize_prompts") else None
        trainer.train()
    info = {"trl_args": {k: getattr(args, k) for k in (
        "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size",
        "max_steps", "num_generations", "max_completion_length", "temperature", "top_k", "top_p", "learning_rate",
        "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "max_grad_norm", "beta",
        "epsilon", "loss_type", "scale_rewards", "top_entropy_quantile", "num_iterations", "use_vllm")},
        "optimiser_steps_per_iteration": layout["optimiser_steps_per_iteration"],
        "prompt_ids_identical_to_ours": None if trl_ids is None else [list(a) == list(b) for a, b in
                                                                       zip(trl_ids, our_ids)]}
    seconds = clock.iteration_seconds(layout["optimiser_steps_per_iteration"])
    if len(seconds) != steps:
        raise RuntimeError(f"TRL ran {len(clock.ends)} optimiser steps, expected {steps} iterations of "
                           f"{layout['optimiser_steps_per_iteration']}")
    return seconds, info


class _StepClock(TrainerCallback):
    """Wall-clock marks at the start of training and at the end of every optimiser step."""

    def __init__(self):
        self.begin: float | None = None
        self.ends: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())

    def iteration_seconds(self, optimiser_steps_per_iteration: int) -> list[float]:
        """Seconds of each iteration: from the previous iteration's last optimiser step to its own last one."""
        marks = [self.begin, *self.ends[optimiser_steps_per_iteration - 1::optimiser_steps_per_iteration]]
        return [b - a for a, b in itertools.pairwise(marks)]


def _batch_layout(config) -> dict[str, int]:
    """TRL's batch arguments for our RL step: one generation batch of prompts_per_step × n sequences, optimiser
    steps of mini_batch_size sequences, forward/backward passes of micro_batch_size sequences."""
    learner = config.learner
    sequences = config.data.prompts_per_step * config.rollout.n_samples
    if learner.num_actors != 1 or learner.max_tokens_per_micro_batch is not None:
        raise ValueError("vs_trl compares one learner process with fixed-size micro-batches against TRL's one process")
    if learner.mini_batch_size % learner.micro_batch_size or sequences % learner.mini_batch_size:
        raise ValueError(f"{sequences} sequences per step, mini-batch {learner.mini_batch_size}, micro-batch "
                         f"{learner.micro_batch_size}: each must divide the one before")
    return {"per_device_train_batch_size": learner.micro_batch_size,
            "gradient_accumulation_steps": learner.mini_batch_size // learner.micro_batch_size,
            "steps_per_generation": sequences // learner.micro_batch_size,
            "optimiser_steps_per_iteration": sequences // learner.mini_batch_size}


def _trl_args(config, out_dir: str, optimiser_steps: int, layout: dict[str, int]):
    from trl import GRPOConfig

    learner, rollout = config.learner, config.rollout
    if learner.lr_warmup_steps:
        raise ValueError("our side must run a constant learning rate (learner.lr_warmup_steps=0), as TRL does here")
    return GRPOConfig(
        output_dir=out_dir, max_steps=optimiser_steps, logging_steps=1, report_to="none", save_strategy="no",
        use_cpu=True, bf16=False, seed=config.training.seed, dataloader_num_workers=0,
        per_device_train_batch_size=layout["per_device_train_batch_size"],
        gradient_accumulation_steps=layout["gradient_accumulation_steps"],
        steps_per_generation=layout["steps_per_generation"],
        num_generations=rollout.n_samples, max_completion_length=rollout.max_new_tokens,
        temperature=rollout.temperature, top_k=0, top_p=1.0,
        learning_rate=learner.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=learner.weight_decay,
        adam_beta1=learner.betas[0], adam_beta2=learner.betas[1], max_grad_norm=learner.grad_clip,
        optim="adamw_torch",
        beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", top_entropy_quantile=0.2,
        num_iterations=1, use_vllm=False,
    )
