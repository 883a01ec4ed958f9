"""The first half of an RL step: prompts → rollouts → rewards → advantages (→ a TrainBatch).

With DAPO's dynamic sampling, groups whose rollouts all scored the same (zero advantage under
every estimator) are dropped and more prompts are rolled out, up to ``max_resample_rounds`` extra
rounds; if the batch is still short it trains on the informative groups it has and says so.

A task whose generator knows what each answer character does (worked addition) gets each response token's
role (:func:`token_roles`), so that the learner can say where each method's selection goes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from orchestrator.config import ExperimentConfig
from orchestrator.data import prompt_token_ids
from orchestrator.data.worked_addition import DECISION_ROLES, ROLE_IDS, roles_of
from workers.learner.advantages import compute_advantages, informative_groups, overlong_penalty
from workers.learner.batch import RoleLegend
from workers.problem import Problem
from workers.rollout.engine import RolloutSample

logger = logging.getLogger(__name__)

WORKED_ROLES = RoleLegend(names=tuple(ROLE_IDS), decisions=frozenset(ROLE_IDS[role] for role in DECISION_ROLES))


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


def advantages_of(rollouts: Rollouts, config: ExperimentConfig) -> torch.Tensor:
    return compute_advantages(
        config.algorithm.advantage_estimator,
        torch.tensor(rollouts.rewards, dtype=torch.float32),
        torch.tensor(rollouts.group_ids),
    )


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
