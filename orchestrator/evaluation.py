"""Validation: avg@k (mean correctness over k samples, the paper's average@16), unbiased pass@k, and how far
the policy has moved from its base (answers changed, KL to the base).

The base's answers are recorded at step 0 (``BaseReference``): its greedy (or first) completion per problem,
and one sample per problem at the rollout temperature with the base's log-probabilities, scored by the
learner. Later evaluations count the completions that differ and estimate KL(base ‖ policy) on those
samples, ``mean over problems of Σ_t log π_base(y_t) − log π(y_t)`` with ``y ~ π_base``: an unbiased Monte
Carlo estimate of the sequence-level KL, at the cost of one learner forward over one answer per problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb
from pathlib import Path

import torch

from orchestrator.config import EvaluationConfig
from orchestrator.data import PromptTemplateConfig, prompt_token_ids
from workers.learner.batch import TrainBatch
from workers.problem import Problem

# In the run folder: the base's answers, so a resumed run compares to the same ones.
BASE_REFERENCE_FILE = "base_reference.pt"
# Seeds the base's reference samples (fixed: every run of a sweep compares to the same draw of its base).
BASE_SAMPLE_SEED = 20_240_601


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021): 1 − C(n−c, k) / C(n, k), the chance that k of n samples hold a correct one."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class Evaluation:
    """One evaluation of the policy: its metrics, and per eval set each problem's completion (greedy, or the
    first of its k samples) with that completion's reward, in problem order."""

    metrics: dict[str, float]
    answers: dict[str, list[str]]
    rewards: dict[str, list[float]]


@dataclass
class BaseReference:
    """The base policy's answers on each eval set, which later evaluations are compared to."""

    completions: dict[str, list[str]]  # per eval set: the base's (greedy or first) completion per problem
    samples: dict[str, TrainBatch]  # per eval set: one T-sample per problem, old_logp = log π_base (learner)

    def save(self, path: Path) -> None:
        torch.save({"completions": self.completions,
                    "samples": {name: vars(batch) for name, batch in self.samples.items()}}, path)

    @classmethod
    def load(cls, path: Path) -> BaseReference:
        state = torch.load(path, weights_only=False)
        return cls(state["completions"], {name: TrainBatch(**fields) for name, fields in state["samples"].items()})


def evaluate(
    eval_sets: dict[str, list[Problem]],
    rollout,
    score_fn,
    tokenizer,
    template: PromptTemplateConfig,
    config: EvaluationConfig,
    base: BaseReference | None = None,
    learners=None,
) -> Evaluation:
    """``score_fn(completions, problems) -> list[float]`` (1.0 = correct). Returns the metrics and the
    completion of each problem (greedy, or the first of its k samples) with its reward. With ``base`` (and
    ``learners``, which score the base's samples under the current weights) it adds ``changed_vs_base`` and
    ``kl_to_base``."""
    metrics: dict[str, float] = {}
    answers: dict[str, list[str]] = {}
    rewards: dict[str, list[float]] = {}
    n = 1 if config.greedy else config.k
    for name, problems in eval_sets.items():
        problems = _capped(problems, config)
        prompts = [prompt_token_ids(problem, tokenizer, template) for problem in problems]
        samples = rollout.generate(prompts, n=n, greedy=config.greedy, seed=None if config.greedy else config.seed)
        completions = tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
        scores = score_fn(completions, [problems[s.prompt_index] for s in samples])
        correct_per_problem = [0] * len(problems)
        for sample, score in zip(samples, scores, strict=True):
            correct_per_problem[sample.prompt_index] += int(score >= 1.0)
        metrics[f"eval/{name}/accuracy"] = sum(correct_per_problem) / (n * len(problems))
        metrics[f"eval/{name}/pass_at_{n}"] = sum(pass_at_k(n, c, n) for c in correct_per_problem) / len(problems)
        metrics[f"eval/{name}/response_length"] = sum(len(s.response_ids) for s in samples) / len(samples)
        answers[name] = completions[::n]  # samples come grouped by prompt, in prompt order
        rewards[name] = scores[::n]
        if base is not None and name in base.completions:
            before = base.completions[name]
            metrics[f"eval/{name}/changed_vs_base"] = sum(a != b for a, b in zip(answers[name], before, strict=True)) / len(before)
            if learners is not None:
                metrics[f"eval/{name}/kl_to_base"] = kl_to_base(base.samples[name], learners)
    return Evaluation(metrics, answers, rewards)


def base_metrics(initial: dict[str, float]) -> dict[str, float]:
    """The step-0 evaluation again under ``base/<set>/<metric>`` (the ablation table's base row), plus
    ``base/accuracy``: the first eval set's accuracy, the one number every run's log starts with."""
    metrics = {"base/" + key.removeprefix("eval/"): value for key, value in initial.items() if key.startswith("eval/")}
    accuracies = [value for key, value in metrics.items() if key.endswith("/accuracy")]
    if accuracies:
        metrics["base/accuracy"] = accuracies[0]
    return metrics


def base_reference(
    eval_sets: dict[str, list[Problem]], answers: dict[str, list[str]], rollout, learners, tokenizer,
    template: PromptTemplateConfig, config: EvaluationConfig, pad_id: int,
) -> BaseReference:
    """Record the base (call it before the first update): ``answers`` from its evaluation, plus one sample per
    problem at the rollout temperature and its log-probabilities under the base, from the learner."""
    samples: dict[str, TrainBatch] = {}
    for name, problems in eval_sets.items():
        prompts = [prompt_token_ids(problem, tokenizer, template) for problem in _capped(problems, config)]
        drawn = rollout.generate(prompts, n=1, seed=BASE_SAMPLE_SEED)
        batch = TrainBatch.from_lists([s.prompt_ids for s in drawn], [s.response_ids for s in drawn],
                                      advantages=[0.0] * len(drawn), group_ids=range(len(drawn)), pad_id=pad_id)
        samples[name] = learners.compute_reference_stats(batch)
    return BaseReference(answers, samples)


def kl_to_base(samples: TrainBatch, learners) -> float:
    """KL(base ‖ current) estimated on the base's own samples (their ``old_logp`` is log π_base)."""
    current = learners.compute_reference_stats(samples).old_logp
    per_sequence = ((samples.old_logp - current) * samples.response_mask).sum(dim=1)
    return float(per_sequence.mean())


def _capped(problems: list[Problem], config: EvaluationConfig) -> list[Problem]:
    return problems[: config.max_problems] if config.max_problems else problems
