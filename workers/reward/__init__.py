"""Reward workers: verifiers per problem domain, a sandbox for code, a process pool and the Ray actor.

Entry points (import from their modules; this package imports nothing, so that importing
``workers.reward.config`` stays cheap): ``config.RewardConfig``, ``scorer.RewardScorer``,
``actor.RewardWorker``, ``results.RewardResult`` / ``RewardBatchStats``, and the verifiers
``*_verifier.verify_*`` (pure functions ``(completion, problem) -> float``). See README.md.
"""
