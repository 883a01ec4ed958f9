"""The driver's RL step, in one place: prompts → rollouts → rewards → advantages → a TrainBatch → the learners'
update → the weight sync → the step's metrics (:func:`rl_step`).

With DAPO's dynamic sampling, groups whose rollouts all scored the same (zero advantage under
every estimator) are dropped and more prompts are rolled out, up to ``max_resample_rounds`` extra
rounds; if the batch is still short it trains on the informative groups it has and says so.

Advantages: one scalar per sequence from outcome rewards, ``rewards`` [N], with ``group_ids`` [N] naming the prompt
each sequence answers (a group = the n rollouts of one prompt); the learner broadcasts it over the sequence's
tokens. The estimators are pure functions in a registry (``register_advantage_estimator``; the config's
``algorithm.advantage_estimator`` names one).

A task whose generator knows what each answer character does (worked addition) gets each response token's
role (:func:`token_roles`), so that the learner can say where each method's selection goes.

With ``rollout.max_staleness`` k > 0 the rollouts of a step are those collected k steps earlier, while the learners
trained (orchestrator/rollout_ahead.py). Who runs what: orchestrator/actors.py starts the actors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from orchestrator.data import prompt_token_ids
from orchestrator.data.worked_addition import DECISION_ROLES, ROLE_IDS, roles_of
from workers.learner.batch import RoleLegend, TrainBatch
from workers.problem import Problem
from workers.rollout.engine import RolloutSample

if TYPE_CHECKING:  # types only: the config validates estimator names against this module's registry
    from orchestrator.actors import Workers
    from orchestrator.config import ExperimentConfig
    from orchestrator.rollout_ahead import RolloutAhead

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


@dataclass
class Rollouts:
    """Sequences of one step, grouped by prompt (a group's samples are adjacent)."""

    samples: list[RolloutSample] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # one per sample
    group_ids: list[int] = field(default_factory=list)  # one per sample
    rewards: list[float] = field(default_factory=list)  # shaped (what the advantages use)
    correct: list[float] = field(default_factory=list)  # verifier scores alone
    generate_seconds: float = 0.0
    reward_seconds: float = 0.0

    def extend(self, other: Rollouts, keep: list[bool]) -> None:
        for index, flag in enumerate(keep):
            if flag:
                self.samples.append(other.samples[index])
                self.problems.append(other.problems[index])
                self.group_ids.append(other.group_ids[index])
                self.rewards.append(other.rewards[index])
                self.correct.append(other.correct[index])

    @property
    def num_groups(self) -> int:
        return len(set(self.group_ids))


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


# ---------------------------------------------------------------------------------------------- advantages
ADVANTAGE_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {}


def register_advantage_estimator(name: str):
    def decorator(fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]):
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return decorator


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max()) + 1 if inverse.numel() else 0


def group_mean_std(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sequence (group mean, unbiased group std, group size), each [N]."""
    index, n_groups = _group_index(group_ids)
    rewards = rewards.double()
    size = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(rewards))
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, rewards)
    mean = total / size
    squared_dev = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, index, (rewards - mean[index]).square())
    std = (squared_dev / (size - 1).clamp_min(1)).sqrt()
    return mean[index], std[index], size[index]


@register_advantage_estimator("grpo")
def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: (r − mean_group) / (std_group + ε); a group of one sequence gets 0."""
    mean, std, size = group_mean_std(rewards, group_ids)
    advantages = (rewards.double() - mean) / (std + eps)
    return torch.where(size > 1, advantages, torch.zeros_like(advantages)).float()


@register_advantage_estimator("grpo_no_std")
def grpo_no_std_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO: r − mean_group, without the std normalisation (which favours easy/hard groups)."""
    mean, _, size = group_mean_std(rewards, group_ids)
    advantages = rewards.double() - mean
    return torch.where(size > 1, advantages, torch.zeros_like(advantages)).float()


@register_advantage_estimator("rloo")
def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RLOO: r_i − mean of the other n − 1 rewards of the group = n/(n−1) · (r_i − mean)."""
    mean, _, size = group_mean_std(rewards, group_ids)
    advantages = (rewards.double() - mean) * size / (size - 1).clamp_min(1)
    return torch.where(size > 1, advantages, torch.zeros_like(advantages)).float()


def compute_advantages(name: str, rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    try:
        estimator = ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGE_ESTIMATORS)}") from None
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be equal 1-D shapes")
    return estimator(rewards, group_ids, eps)


def informative_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: True for sequences whose group's rewards are not all equal.

    Groups where every rollout got the same reward have zero advantage under every estimator
    above, so they contribute no policy gradient and only dilute the batch.
    """
    index, n_groups = _group_index(group_ids)
    low = torch.full((n_groups,), float("inf"), dtype=torch.float64).scatter_reduce(
        0, index, rewards.double(), reduce="amin"
    )
    high = torch.full((n_groups,), float("-inf"), dtype=torch.float64).scatter_reduce(
        0, index, rewards.double(), reduce="amax"
    )
    return (high > low)[index]


def overlong_penalty(response_lengths: torch.Tensor, max_length: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward of each sequence [N].

    0 while L ≤ L_max − L_buffer, then a linear ramp down to −1 at L = L_max, and −1 beyond.
    """
    if buffer <= 0 or buffer > max_length:
        raise ValueError(f"overlong buffer must be in (0, max_length={max_length}], got {buffer}")
    start = max_length - buffer
    lengths = response_lengths.double()
    ramp = (start - lengths) / buffer
    penalty = torch.where(lengths <= start, torch.zeros_like(lengths), ramp).clamp_min(-1.0)
    return (penalty * factor).float()
