"""The policy a run starts from: the materialised model, optionally after a supervised warm-up.

A tiny model built from config knows nothing, so RL would see no reward variance; a short
supervised warm-up on the training task gives it a base policy first. The result is cached on
disk, keyed by everything that determines it, and shared by every trial of a sweep (a file lock
keeps two concurrent trials from training it twice). The warm-up is deterministic (one thread,
deterministic kernels, seeded order), its weights' sha256 is written with it and checked on every load.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from filelock import FileLock

from orchestrator.config import ExperimentConfig
from orchestrator.data import load_dataset, prompt_token_ids
from workers.learner.sft import CHECKSUM_FILE, folder_checksum, supervised_warmup
from workers.models.char_tokenizer import load_tokenizer
from workers.models.materialize import materialize_model

logger = logging.getLogger(__name__)

# Part of the cache key: bumped when the warm-up's numerics change (v2: one thread, deterministic kernels,
# a checksum file), so a base trained the old way is never picked up as if it were the new one.
WARMUP_FORMAT = "v2-deterministic"


def prepare_policy(config: ExperimentConfig) -> Path:
    model_dir = materialize_model(config.model)
    if not config.warmup.enabled:
        return model_dir
    key = json.dumps(
        [config.model.model_dump(mode="json", exclude={"cache_dir"}), config.warmup.model_dump(mode="json"),
         config.data.train.model_dump(mode="json"), config.data.prompt_template.model_dump(mode="json"),
         WARMUP_FORMAT],
        sort_keys=True,
    )
    out_dir = config.model.cache_dir / f"warmup-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    with FileLock(str(out_dir) + ".lock"):
        if (out_dir / "config.json").is_file():
            verify_checksum(out_dir)
            logger.info("Base policy from cache: %s (sha256 %s)", out_dir, base_checksum(out_dir))
            return out_dir
        tokenizer = load_tokenizer(model_dir)
        spec = config.data.train.model_copy(update={"limit": config.warmup.examples})
        examples = [
            (prompt_token_ids(problem, tokenizer, config.data.prompt_template),
             tokenizer(problem.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
            for problem in load_dataset(spec)
        ]
        logger.info("Supervised warm-up: %d steps on %d examples", config.warmup.steps, len(examples))
        supervised_warmup(model_dir, examples, steps=config.warmup.steps, lr=config.warmup.lr,
                          batch_size=config.warmup.batch_size, seed=config.warmup.seed, out_dir=out_dir)
        logger.info("Base policy trained: %s (sha256 %s)", out_dir, base_checksum(out_dir))
        return out_dir


def base_checksum(policy_dir: Path) -> str:
    """The sha256 recorded when a warmed-up base was trained (``workers.learner.sft.folder_checksum``)."""
    return json.loads((Path(policy_dir) / CHECKSUM_FILE).read_text())["sha256"]


def policy_checksum(config: ExperimentConfig, policy_dir: Path) -> str | None:
    """What a run logs as ``base/checksum`` (equal checksums: the same start, bit for bit): the recorded one of
    a warmed-up base, the computed one of a tiny model built from config; None for downloaded checkpoints,
    which their path already names (hashing gigabytes per run would cost more than it tells)."""
    if config.warmup.enabled:
        return base_checksum(policy_dir)
    if config.model.source == "tiny":
        return folder_checksum(policy_dir)
    return None


def verify_checksum(policy_dir: Path) -> None:
    """Refuse a cached base whose weights no longer match the checksum written when it was trained."""
    recorded, actual = base_checksum(policy_dir), folder_checksum(policy_dir)
    if recorded != actual:
        raise RuntimeError(f"warmup: the cached base policy {policy_dir} has weights with sha256 {actual}, but "
                           f"{recorded} was recorded when it was trained; delete the folder to retrain it")
