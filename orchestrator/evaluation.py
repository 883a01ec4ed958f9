"""Validation: avg@k (mean correctness over k samples, the paper's average@16) and unbiased pass@k."""

from __future__ import annotations

from math import comb

from orchestrator.config import EvaluationConfig
from orchestrator.data import PromptTemplateConfig, prompt_token_ids
from workers.problem import Problem


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021): 1 − C(n−c, k) / C(n, k), the chance that k of n samples hold a correct one."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(
    eval_sets: dict[str, list[Problem]],
    rollout,
    score_fn,
    tokenizer,
    template: PromptTemplateConfig,
    config: EvaluationConfig,
) -> dict[str, float]:
    """``score_fn(completions, problems) -> list[float]`` (1.0 = correct)."""
    metrics: dict[str, float] = {}
    n = 1 if config.greedy else config.k
    for name, problems in eval_sets.items():
        problems = problems[: config.max_problems] if config.max_problems else problems
        prompts = [prompt_token_ids(problem, tokenizer, template) for problem in problems]
        samples = rollout.generate(prompts, n=n, greedy=config.greedy)
        completions = tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
        scores = score_fn(completions, [problems[s.prompt_index] for s in samples])
        correct_per_problem = [0] * len(problems)
        for sample, score in zip(samples, scores, strict=True):
            correct_per_problem[sample.prompt_index] += int(score >= 1.0)
        metrics[f"eval/{name}/accuracy"] = sum(correct_per_problem) / (n * len(problems))
        metrics[f"eval/{name}/pass_at_{n}"] = sum(pass_at_k(n, c, n) for c in correct_per_problem) / len(problems)
        metrics[f"eval/{name}/response_length"] = sum(len(s.response_ids) for s in samples) / len(samples)
    return metrics
