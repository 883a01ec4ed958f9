"""The driver's RL step, in one place: prompts → rollouts → rewards → advantages → a TrainBatch → the
learners' update → the weight sync → the step's metrics (:func:`rl_step`).

With DAPO's dynamic sampling, groups whose rollouts all scored the same (zero advantage under
every estimator) are dropped and more prompts are rolled out, up to ``max_resample_rounds`` extra
rounds; if the batch is still short it trains on the informative groups it has and says so.

Advantages: one scalar per sequence from its group's outcome rewards (orchestrator/advantages.py, pure functions).

A task whose generator knows what each answer character does (worked addition) gets each response token's
role (:func:`token_roles`), so that the learner can say where each method's selection goes.

With ``rollout.max_staleness`` k > 0 the rollouts of a step are those collected k steps earlier, while the learners
trained (orchestrator/rollout_ahead.py). Who runs what: orchestrator/actors.py starts the actors.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from orchestrator.advantages import compute_advantages, informative_groups, overlong_penalty
from orchestrator.config import ExperimentConfig
from orchestrator.data import prompt_token_ids
from orchestrator.data.worked_addition import DECISION_ROLES, ROLE_IDS, roles_of
from orchestrator.rollout_ahead import RolloutAhead, Rollouts
from workers.learner.batch import RoleLegend, TrainBatch
from workers.problem import Problem

if TYPE_CHECKING:  # a type only: the actors' module loads Ray, DeepSpeed and vLLM, which the pure parts do not need
    from orchestrator.actors import Workers

logger = logging.getLogger(__name__)

WORKED_ROLES = RoleLegend(names=tuple(ROLE_IDS), decisions=frozenset(ROLE_IDS[role] for role in DECISION_ROLES))


def rl_step(step: int, config: ExperimentConfig, workers: Workers, ahead: RolloutAhead, tokenizer,
            last_batch: TrainBatch | None) -> tuple[dict[str, float], TrainBatch | None]:
    """One GRPO-style step: collect → rewards → advantages → batch → learner update → weight sync → metrics.

    The engines hold the weights of version step − 1. ``ahead`` gives the step's rollouts with their rewards
    (collected now, or k steps ago with max_staleness k, while the learners train). Returns the step's metrics
    and the batch trained on (the previous one when every group was dropped by dynamic sampling)."""
    collected = ahead.take(version=step - 1)
    rollouts, metrics = collected.rollouts, dict(collected.metrics)
    staleness = step - 1 - collected.version  # learner versions since the weights that sampled the batch
    if not 0 <= staleness <= config.rollout.max_staleness:
        raise RuntimeError(f"step {step}: a batch sampled by version {collected.version} is {staleness} versions "
                           f"old, past rollout.max_staleness={config.rollout.max_staleness}")
    metrics["rollout/staleness"] = float(staleness)
    batch = last_batch
    if rollouts.num_groups:
        batch = train_batch(rollouts, staleness, tokenizer, config)
        metrics.update(workers.learners.train_step(batch, step))
    metrics["time/rollout_wait"] = ahead.settle()  # the engines' weights change only between collections
    if rollouts.num_groups:
        metrics["time/sync"] = workers.weights.push()
    return metrics, batch


def train_batch(rollouts: Rollouts, staleness: int, tokenizer, config: ExperimentConfig) -> TrainBatch:
    """The learners' input: each sample's tokens, its group's advantage, the engine's log-probs of its tokens
    (importance ratios, π agreement), token roles where known, and how stale its sampling weights are."""
    advantages = compute_advantages(config.algorithm.advantage_estimator,
                                    torch.tensor(rollouts.rewards, dtype=torch.float32),
                                    torch.tensor(rollouts.group_ids))
    roles, legend = token_roles(rollouts, tokenizer) or (None, None)
    samples = rollouts.samples
    return TrainBatch.from_lists(
        [s.prompt_ids for s in samples], [s.response_ids for s in samples], advantages, rollouts.group_ids,
        pad_id=pad_id(tokenizer), sampling_logp=[s.response_logprobs for s in samples],
        token_roles=roles, role_legend=legend,
        staleness=[staleness] * len(samples) if config.rollout.max_staleness else None)


def roll_out(problems: list[Problem], first_group_id: int, rollout, score_fn, tokenizer,
             config: ExperimentConfig) -> Rollouts:
    """``first_group_id`` numbers the groups and seeds their sampling: the same step of a resumed
    run draws the same samples as the uninterrupted run did."""
    prompts = [prompt_token_ids(problem, tokenizer, config.data.prompt_template) for problem in problems]
    started = time.perf_counter()
    seed = config.training.seed * 1_000_003 + first_group_id
    samples = rollout.generate(prompts, n=config.rollout.n_samples, seed=seed)
    generated = time.perf_counter()
    completions = tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
    sample_problems = [problems[s.prompt_index] for s in samples]
    correct = list(score_fn(completions, sample_problems))
    scored = time.perf_counter()
    rewards = torch.tensor(correct, dtype=torch.float32)
    overlong = config.algorithm.overlong
    if overlong.enabled:
        lengths = torch.tensor([len(s.response_ids) for s in samples])
        buffer = min(overlong.buffer or max(1, config.rollout.max_new_tokens // 5), config.rollout.max_new_tokens)
        rewards = rewards + overlong_penalty(lengths, config.rollout.max_new_tokens, buffer, overlong.factor)
    return Rollouts(
        samples=samples,
        problems=sample_problems,
        group_ids=[first_group_id + s.prompt_index for s in samples],
        rewards=rewards.tolist(),
        correct=correct,
        generate_seconds=generated - started,
        reward_seconds=scored - generated,
    )


def collect(sampler, rollout, score_fn, tokenizer, config: ExperimentConfig, next_group_id: int
            ) -> tuple[Rollouts, dict[str, float], int]:
    """Roll out one step's prompts (resampling for DAPO); returns rollouts, metrics, next group id."""
    wanted = config.data.prompts_per_step
    algorithm = config.algorithm
    kept = Rollouts()
    first_round: Rollouts | None = None
    generate_seconds = reward_seconds = 0.0
    rounds = 0
    for rounds in range(1, algorithm.max_resample_rounds + 2):
        batch = roll_out(next(sampler), next_group_id, rollout, score_fn, tokenizer, config)
        next_group_id += wanted
        generate_seconds += batch.generate_seconds
        reward_seconds += batch.reward_seconds
        first_round = first_round or batch
        if not algorithm.dynamic_sampling:
            kept = batch
            break
        informative = informative_groups(torch.tensor(batch.rewards), torch.tensor(batch.group_ids)).tolist()
        kept.extend(batch, informative)
        if kept.num_groups >= wanted:
            break
    if algorithm.dynamic_sampling:
        kept = _first_groups(kept, wanted)
        if kept.num_groups < wanted:
            logger.warning(
                "dynamic sampling: %d of %d informative groups after %d rollout rounds "
                "(algorithm.max_resample_rounds=%d); training on those",
                kept.num_groups, wanted, rounds, algorithm.max_resample_rounds,
            )
    assert first_round is not None
    lengths = [len(s.response_ids) for s in first_round.samples]
    metrics = {
        # accuracy/reward of the first round: what the policy does on fresh prompts, before filtering
        "train/accuracy": sum(score >= 1.0 for score in first_round.correct) / len(first_round.correct),
        "reward/mean": sum(first_round.rewards) / len(first_round.rewards),
        "train/response_length": sum(lengths) / len(lengths),
        "train/truncated_fraction": sum(s.finish_reason == "length" for s in first_round.samples) / len(lengths),
        "train/groups": float(kept.num_groups),
        "train/rollout_rounds": float(rounds),
        "time/rollout": generate_seconds,
        "time/reward": reward_seconds,
    }
    return kept, metrics, next_group_id


def _first_groups(rollouts: Rollouts, count: int) -> Rollouts:
    allowed = list(dict.fromkeys(rollouts.group_ids))[:count]
    trimmed = Rollouts()
    trimmed.extend(rollouts, [g in set(allowed) for g in rollouts.group_ids])
    return trimmed


def token_roles(rollouts: Rollouts, tokenizer) -> tuple[list[list[int]], RoleLegend] | None:
    """Each response token's role id (``ROLE_IDS``) for the worked-addition samples, ``[]`` for the others;
    None when no sample has roles. The grammar labels characters, so a response gets roles only when each of
    its tokens is exactly one character (the tiny model's tokenizer; not a BPE one) — the end token is format."""
    pieces: dict[int, str] = {}  # token id → its text, decoded once per step

    def roles_of_sample(sample, problem) -> list[int]:
        if not problem.metadata.get("worked"):
            return []
        ids = [i for i in sample.response_ids if i != tokenizer.eos_token_id]
        for i in ids:
            if i not in pieces:
                pieces[i] = tokenizer.decode([i])
        # The joined pieces must be the decoded text: a byte split over tokens decodes to one character each.
        if any(len(pieces[i]) != 1 for i in ids) or "".join(pieces[i] for i in ids) != tokenizer.decode(ids):
            return []
        text_roles = iter(roles_of("".join(pieces[i] for i in ids), problem.metadata["digits"]))
        return [ROLE_IDS["f"] if i == tokenizer.eos_token_id else ROLE_IDS[next(text_roles)]
                for i in sample.response_ids]

    roles = [roles_of_sample(s, p) for s, p in zip(rollouts.samples, rollouts.problems, strict=True)]
    return (roles, WORKED_ROLES) if any(roles) else None


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
