"""The model and prompts a benchmark runs on, taken from a training preset (so they are what training uses)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from orchestrator.config import ExperimentConfig
from orchestrator.config_loader import load_experiment
from orchestrator.data import load_dataset, prompt_token_ids
from workers.models.char_tokenizer import load_tokenizer
from workers.models.materialize import materialize_model
from workers.problem import Problem


@dataclass
class PresetWorkload:
    label: str
    config: ExperimentConfig
    model_dir: Path
    tokenizer: PreTrainedTokenizerBase
    problems: list[Problem]
    prompt_ids: list[list[int]]


def preset_workload(label: str, preset: str, num_prompts: int, overrides: list[str] | None = None) -> PresetWorkload:
    """The preset's (un-warmed) model and the first ``num_prompts`` training prompts, as token ids."""
    # Benchmarks run engines in their own process at its --threads; a preset's per-actor count is for actors.
    config = load_experiment(preset, ["rollout.threads_per_actor=null", *(overrides or [])])
    model_dir = materialize_model(config.model)
    tokenizer = load_tokenizer(model_dir)
    spec = config.data.train.model_copy(update={"limit": max(num_prompts, config.data.train.limit or 0)})
    problems = load_dataset(spec)[:num_prompts]
    if len(problems) < num_prompts:
        raise ValueError(f"{preset}: wanted {num_prompts} training prompts, the data gives {len(problems)}")
    ids = [prompt_token_ids(p, tokenizer, config.data.prompt_template) for p in problems]
    # Prompts longer than the rollout allows would be rejected by the engine; the benchmark clips them.
    ids = [p[-config.rollout.max_prompt_tokens:] for p in ids]
    return PresetWorkload(label, config, model_dir, tokenizer, problems, ids)
