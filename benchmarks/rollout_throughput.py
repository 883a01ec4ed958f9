"""Rollout throughput: the vLLM ``RolloutEngine`` vs plain transformers ``generate``, and the price of n=16.

Per model (the preset's model and training prompts), side by side in one process:

- ``vllm``: ``RolloutEngine.generate(prompts, n)`` — what the loop calls: sampling at the
  rollout temperature, with the sampled tokens' logprobs;
- ``hf``: ``model.generate`` on the same prompts (left-padded), ``num_return_sequences=n``, the
  same temperature, top-k off, top-p 1, the same max_new_tokens; no logprobs.
Throughput = generated tokens (up to and including EOS) / seconds; the figure is vLLM / HF.

Then, on the engine's own ``LLM``, the same prompts with ``n=16`` and per-token logprobs against
``n=1`` without: the time ratio (what a 16-sample group costs over one sample) and the per-token
time ratio; plus ``n=16`` with vs without logprobs (the cost of returning logprobs alone).
Both paths use the threads vLLM's CPU worker sets for the process (it pins them at start).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from benchmarks.report import BenchmarkResult, Figure
from benchmarks.timing import interleaved, paired_ratio
from benchmarks.workloads import PresetWorkload, preset_workload
from workers.rollout import RolloutEngine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scale:
    label: str
    preset: str
    prompts: int
    n: int  # samples per prompt for the vLLM-vs-HF comparison (the preset's group size)
    rounds: int


def scales(smoke: bool) -> list[Scale]:
    if smoke:
        return [Scale("tiny-s", "cpu-tiny-s", 4, 2, rounds=1)]
    return [
        Scale("tiny-s", "cpu-tiny-s", 32, 8, rounds=7),  # 32 prompts × the preset's 8 samples (its RL step rolls out 128)
        Scale("smollm2-135m", "cpu-smollm2", 8, 4, rounds=3),
    ]


def run(smoke: bool) -> dict:
    figures: list[Figure] = []
    settings: dict = {}
    measurements: dict = {}
    for scale in scales(smoke):
        workload = preset_workload(scale.label, scale.preset, scale.prompts)
        result = _measure(scale, workload)
        figures += result["figures"]
        settings[scale.label] = result["settings"]
        measurements[scale.label] = result["measurements"]
    return BenchmarkResult(
        title="vLLM RolloutEngine vs transformers generate; n=16 with logprobs vs n=1",
        settings=settings, figures=figures, measurements=measurements,
        notes=[("tokens/s counts generated tokens up to and including EOS; the ratios are paired medians over "
                "interleaved rounds.")],
    ).as_dict()


def _measure(scale: Scale, workload: PresetWorkload) -> dict:
    from vllm import SamplingParams

    rollout_config = workload.config.rollout
    engine = RolloutEngine(workload.model_dir, rollout_config)
    try:
        model = AutoModelForCausalLM.from_pretrained(workload.model_dir, dtype=torch.float32).eval()
        tokenizer = workload.tokenizer
        eos = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        prompts = workload.prompt_ids
        input_ids, attention_mask = _left_pad(prompts, pad)
        generated: dict[str, list[int]] = {}

        def vllm_generate() -> None:
            samples = engine.generate(prompts, n=scale.n)
            generated.setdefault("vllm", []).append(sum(len(s.response_ids) for s in samples))

        def hf_generate() -> None:
            with torch.no_grad():
                out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True,
                                     temperature=rollout_config.temperature, top_k=0, top_p=1.0,
                                     max_new_tokens=rollout_config.max_new_tokens, num_return_sequences=scale.n,
                                     pad_token_id=pad, eos_token_id=eos)
            generated.setdefault("hf", []).append(_count_until_eos(out[:, input_ids.shape[1]:], eos))

        def sampling(n: int, logprobs: int | None):
            params = SamplingParams(n=n, temperature=rollout_config.temperature, top_p=1.0, top_k=0,
                                    max_tokens=rollout_config.max_new_tokens, logprobs=logprobs)
            key = f"n{n}{'_logprobs' if logprobs is not None else ''}"

            def call() -> None:
                outputs = engine.llm.generate(_tokens_prompts(prompts), params, use_tqdm=False)
                generated.setdefault(key, []).append(sum(len(c.token_ids) for o in outputs for c in o.outputs))

            return key, call

        cases = {"vllm": vllm_generate, "hf": hf_generate}
        cases.update(dict([sampling(16, 0), sampling(16, None), sampling(1, None)]))
        threads = torch.get_num_threads()
        samples = interleaved(cases, rounds=scale.rounds, warmup=1)
    finally:
        engine.shutdown()

    # Every call appended its token count, the warm-up round's included: drop those.
    tokens = {key: counts[-scale.rounds:] for key, counts in generated.items()}
    per_second = {key: [t / s for t, s in zip(tokens[key], samples.seconds[key])] for key in cases}
    median = lambda values: sorted(values)[len(values) // 2]
    label = scale.label
    speed = [v / h for v, h in zip(per_second["vllm"], per_second["hf"])]
    per_token = {key: [s / t for s, t in zip(samples.seconds[key], tokens[key])] for key in cases}
    figures = [
        Figure(f"{label}: vLLM / HF generate throughput", median(speed), "×",
               f"vLLM {median(per_second['vllm']):.0f} tok/s vs HF {median(per_second['hf']):.0f} tok/s; "
               f"{scale.prompts} prompts × n={scale.n}"),
        Figure(f"{label}: time n=16+logprobs / n=1 plain", paired_ratio(samples, "n16_logprobs", "n1"), "×",
               f"{median(tokens['n16_logprobs'])} vs {median(tokens['n1'])} tokens"),
        Figure(f"{label}: per-token time n=16+logprobs / n=1 plain",
               median([a / b for a, b in zip(per_token["n16_logprobs"], per_token["n1"])]), "×",
               "< 1: batching 16 samples per prompt is cheaper per token"),
        Figure(f"{label}: time n=16 with / without logprobs", paired_ratio(samples, "n16_logprobs", "n16"), "×",
               "the cost of returning the sampled tokens' logprobs"),
    ]
    return {
        "figures": figures,
        "settings": {
            "preset": scale.preset, "model_dir": str(workload.model_dir), "prompts": scale.prompts,
            "n_vs_hf": scale.n, "max_new_tokens": rollout_config.max_new_tokens,
            "temperature": rollout_config.temperature, "prompt_tokens": [len(p) for p in prompts][:8],
            "threads_after_engine_start": threads, "rounds": scale.rounds, "warmup_rounds": 1,
        },
        "measurements": {"seconds": samples.summary(), "tokens": tokens},
    }


def _left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def _count_until_eos(generated: torch.Tensor, eos: int) -> int:
    """Tokens per row up to and including the first EOS (all of them when there is none), summed."""
    is_eos = generated == eos
    lengths = torch.full((generated.shape[0],), generated.shape[1], dtype=torch.long)
    finished = is_eos.any(-1)
    lengths[finished] = is_eos[finished].int().argmax(-1) + 1
    return int(lengths.sum())


def _tokens_prompts(prompt_ids: list[list[int]]):
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids]
