"""``load_dataset``: the one entry point from a ``DatasetSpec`` to a list of problems."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from orchestrator.data.arithmetic import arithmetic_problems
from orchestrator.data.benchmarks import PACKAGED_LOADERS
from orchestrator.data.config import DatasetSpec
from orchestrator.data.files import load_problem_file
from orchestrator.data.reasoning_gym_tasks import reasoning_gym_problems
from workers.problem import Problem

logger = logging.getLogger(__name__)


def load_dataset(spec: DatasetSpec) -> list[Problem]:
    """The problems ``spec`` names, at most ``spec.limit`` of them, with unique ids."""
    problems = _load_source(spec)
    if spec.limit is not None:
        problems = problems[: spec.limit]
    duplicates = [problem_id for problem_id, count in Counter(p.id for p in problems).items() if count > 1]
    if duplicates:
        raise ValueError(f"source: {spec.source!r} yields duplicate problem ids, e.g. {duplicates[:5]}")
    logger.info("data: %d problems from %s (split=%s)", len(problems), spec.source, spec.resolved_split)
    return problems


def _load_source(spec: DatasetSpec) -> list[Problem]:
    split = spec.resolved_split
    if spec.source == "arithmetic":
        return arithmetic_problems(spec.arithmetic_options, split, spec.limit, spec.seed)
    if spec.source == "reasoning_gym":
        # DatasetSpec guarantees options and limit for this source.
        return reasoning_gym_problems(spec.reasoning_gym, split, spec.limit, spec.seed)
    if spec.source in PACKAGED_LOADERS:
        return PACKAGED_LOADERS[spec.source](spec.seed)
    return load_problem_file(Path(spec.source).expanduser())
