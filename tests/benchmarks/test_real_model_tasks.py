"""The candidate table of benchmarks/real_model_tasks.py without an engine: every candidate loads, its prompts
fit the engine, and the table and intervals are computed as documented."""

from __future__ import annotations

import math

import pytest

from benchmarks.real_model_tasks import CANDIDATES, TaskAccuracy, _ci95, markdown_table
from orchestrator.data import load_dataset


@pytest.mark.parametrize("candidate", CANDIDATES, ids=lambda c: c.name)
def test_every_candidate_loads_enough_problems(candidate):
    problems = load_dataset(candidate.spec)
    assert len(problems) >= 175  # 1-digit's train split; every other candidate has ≥ 200
    # Problem ids are unique (load_dataset refuses duplicates); reasoning-gym may repeat a question text.
    if candidate.spec.source == "arithmetic":
        assert len({p.prompt for p in problems}) == len(problems)
    assert {p.domain for p in problems} <= {"math", "reasoning_gym"}


def test_interval_is_the_normal_95_percent_half_width():
    values = [1.0] * 25 + [0.0] * 75
    assert _ci95(values) == pytest.approx(1.96 * math.sqrt(0.25 * 0.75 / 100))
    assert math.isnan(_ci95([1.0]))


def test_table_reports_percentages():
    row = TaskAccuracy(name="t", note="n", problems=200, samples_per_problem=2, sampled_accuracy=0.131,
                       sampled_ci95=0.037, greedy_accuracy=0.25, greedy_ci95=0.064, sampled_mean_tokens=29.2,
                       sampled_truncated=0.79, greedy_mean_tokens=25.0, prompt_tokens=38.0, seconds=1.0, examples=[])
    line = markdown_table([row]).splitlines()[-1]
    assert "13.1 ± 3.7 %" in line and "25.0 ± 6.4 %" in line and "79 %" in line
