"""Scores a batch of completions with the verifier of each problem's domain: in a pool of processes, or in this
process for the domains whose check cannot hang (``IN_PROCESS_DOMAINS``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

from workers.problem import Problem
from workers.reward.config import RewardConfig
from workers.reward.dispatch import (
    IN_PROCESS_DOMAINS,
    VERIFIER_NAMES,
    check_deadline_s,
    prepare_verifier_process,
    probe_sandbox,
    verify_completion,
)
from workers.reward.results import RewardBatchStats, RewardResult, VerifierBroken
from workers.reward.verifier_pool import VerifierPool, run_check

logger = logging.getLogger(__name__)


class RewardScorer:
    """Owns ``config.num_workers`` verifier processes; ``score`` never raises for a bad completion.

    A verifier error or timeout scores 0 and is reported in ``RewardResult.error`` (and counted by
    ``RewardBatchStats``); a check that hangs is killed at its deadline (``check_timeout_s``, or the
    sandbox's wall clock plus a grace for code). But when (almost) every check of a domain in one batch
    ends in a verifier error, the verifier itself is broken: ``score`` raises ``VerifierBroken`` naming
    it and its first error (``fail_fast_error_fraction``). Use as a context manager, or call ``close()``.
    """

    def __init__(self, config: RewardConfig):
        self.config = config
        probe_sandbox(config)  # once, here: the verifier processes forked below inherit the result
        self._check = functools.partial(verify_completion, config=config)
        self._pool = VerifierPool(
            self._check,
            config.num_workers,
            prepare=functools.partial(prepare_verifier_process, config),
        )
        self.last_batch_stats: RewardBatchStats | None = None

    def score(self, completions: Sequence[str], problems: Sequence[Problem]) -> list[RewardResult]:
        """One result per completion; ``problems[i]`` is the problem ``completions[i]`` answers."""
        if len(completions) != len(problems):
            raise ValueError(f"score got {len(completions)} completions but {len(problems)} problems")
        pooled = [i for i, problem in enumerate(problems) if problem.domain not in IN_PROCESS_DOMAINS]
        from_pool = dict(zip(pooled, self._pool.run([(completions[i], problems[i]) for i in pooled],
                                                    [check_deadline_s(problems[i], self.config) for i in pooled]),
                             strict=True)) if pooled else {}
        results = [from_pool[i] if i in from_pool else run_check(self._check, (completion, problem))
                   for i, (completion, problem) in enumerate(zip(completions, problems))]
        self.last_batch_stats = RewardBatchStats.from_results(results)
        if self.last_batch_stats.n_failed:
            first_error = next(result.error for result in results if result.error is not None)
            logger.warning("reward: %d of %d checks failed (%d timeouts), e.g. %s", self.last_batch_stats.n_failed,
                           self.last_batch_stats.n, self.last_batch_stats.n_timeout, first_error)
            self._fail_fast(results, problems)
        return results

    def _fail_fast(self, results: Sequence[RewardResult], problems: Sequence[Problem]) -> None:
        threshold = self.config.fail_fast_error_fraction
        if threshold is None:
            return
        for domain in sorted({problem.domain for problem in problems}):
            checks = [result for result, problem in zip(results, problems) if problem.domain == domain]
            errors = [result.error for result in checks if result.error is not None and not result.timed_out]
            if len(checks) >= self.config.fail_fast_min_checks and len(errors) >= threshold * len(checks):
                raise VerifierBroken(
                    f"reward: the {domain} verifier ({VERIFIER_NAMES[domain]}) failed on {len(errors)} of "
                    f"{len(checks)} checks of this batch (fail_fast_error_fraction={threshold:g}); first error: "
                    f"{errors[0]}"
                )

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
