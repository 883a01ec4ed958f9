"""Outcome-reward advantage estimators and DAPO's batch shaping, as pure functions: what the driver's step
(orchestrator/rl_step.py) turns rewards into.

Rewards are one scalar per sequence, ``rewards`` [N], with ``group_ids`` [N] naming the prompt each sequence answers
(a group = the n rollouts of one prompt). Estimators return one advantage per sequence; the learner broadcasts it
over the sequence's tokens. They are registered by name (``register_advantage_estimator``; the config's
``algorithm.advantage_estimator`` names one).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

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
