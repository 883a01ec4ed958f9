"""The policy a run starts from: the materialised model, optionally after a supervised warm-up.

A tiny model built from config knows nothing, so RL would see no reward variance; a short
supervised warm-up on the training task gives it a base policy first. The result is cached on
disk, keyed by everything that determines it, and shared by every trial of a sweep (a file lock
keeps two concurrent trials from training it twice).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from filelock import FileLock
from transformers import AutoTokenizer

from orchestrator.config import ExperimentConfig
from orchestrator.data import load_dataset, prompt_token_ids
from workers.learner.sft import supervised_warmup
from workers.models.materialize import materialize_model

logger = logging.getLogger(__name__)


def prepare_policy(config: ExperimentConfig) -> Path:
    model_dir = materialize_model(config.model)
    if not config.warmup.enabled:
        return model_dir
    key = json.dumps(
        [config.model.model_dump(mode="json", exclude={"cache_dir"}), config.warmup.model_dump(mode="json"),
         config.data.train.model_dump(mode="json"), config.data.prompt_template.model_dump(mode="json")],
        sort_keys=True,
    )
    out_dir = config.model.cache_dir / f"warmup-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    with FileLock(str(out_dir) + ".lock"):
        if (out_dir / "config.json").is_file():
            logger.info("Base policy from cache: %s", out_dir)
            return out_dir
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        spec = config.data.train.model_copy(update={"limit": config.warmup.examples})
        examples = [
            (prompt_token_ids(problem, tokenizer, config.data.prompt_template),
             tokenizer(problem.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
            for problem in load_dataset(spec)
        ]
        logger.info("Supervised warm-up: %d steps on %d examples", config.warmup.steps, len(examples))
        return supervised_warmup(model_dir, examples, steps=config.warmup.steps, lr=config.warmup.lr,
                                 batch_size=config.warmup.batch_size, seed=config.warmup.seed, out_dir=out_dir)
