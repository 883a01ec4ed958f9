"""Only sensible numbers: every float finite, every integer inside a documented bound.

The request models (sweeps.spec, orchestrator.config, workers/*/config.py) type their numbers but
leave them open-ended: pydantic takes ``Infinity``/``NaN`` for a float, and ``1e18`` for an int
(an integral float *is* an int in lax mode). Such a value is never meant and only fails later — a
``.inf`` learning rate in a job file, or a sweep of 1e30 concurrent trials. Rather than patch every
config module, the service walks every validated model it is about to turn into a job (the request
body itself, then every expanded trial config) and checks each number by its field name. The same
walk runs again inside the job before it starts (api/job.py).

The bounds (first matching rule wins; the name is the field's, or the last part of a dotted key):

| rule    | field names                                                    | allowed |
|---------|----------------------------------------------------------------|---------|
| seed    | ``seed``, ``*_seed``                                            | 0 … 2³²−1 (what numpy and vLLM accept) |
| trials  | ``max_concurrent_trials``                                       | ≤ 1024 |
| trials  | ``max_failures``                                                | ≤ 100 |
| steps   | ``steps``, ``*_steps``, ``*interval``, ``*epochs``, ``*rounds`` | ≤ 1,000,000 |
| bytes   | ``*_bytes``                                                     | ≤ 2⁴⁰ (1 TiB) |
| MiB     | ``*_mb``                                                        | ≤ 2²⁰ (1 TiB) |
| length  | ``*tokens*``, ``*length*``, ``max_position_embeddings``         | ≤ 2²⁰ tokens |
| seconds | ``*_s`` (timeouts)                                              | ≤ 604,800 (a week) |
| size    | every other integer (batch sizes, sample counts, actors, limits) | ≤ 10,000,000 |

Every float must be finite, and a sweep may expand to at most ``MAX_TRIALS`` trials. Lower bounds
stay the models' own (``ge=1`` …), except that a seed must not be negative.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

MAX_TRIALS = 1000


@dataclass(frozen=True)
class Bound:
    rule: str
    pattern: re.Pattern[str]
    maximum: int
    minimum: int | None = None


BOUNDS: tuple[Bound, ...] = (
    Bound("seed", re.compile(r"^(.*_)?seed$"), 2**32 - 1, minimum=0),
    Bound("trials", re.compile(r"^max_concurrent_trials$"), 1024),
    Bound("trials", re.compile(r"^max_failures$"), 100),
    Bound("steps", re.compile(r"^(.*_)?steps$|interval$|epochs$|rounds$"), 1_000_000),
    Bound("bytes", re.compile(r"_bytes$"), 2**40),
    Bound("MiB", re.compile(r"_mb$"), 2**20),
    Bound("length", re.compile(r"tokens|length|^max_position_embeddings$"), 2**20),
    Bound("seconds", re.compile(r"_s$"), 604_800),
    Bound("size", re.compile(r""), 10_000_000),
)


def bound_for(name: str) -> Bound:
    return next(bound for bound in BOUNDS if bound.pattern.search(name))


def number_errors(value: Any, path: str) -> list[tuple[str, str]]:
    """(dotted field path, message) for every non-finite float and out-of-bound integer in ``value``
    (a pydantic model, or the dicts/lists of a request's free-form parts)."""
    return list(_walk(value, path, name="", typed=isinstance(value, BaseModel)))


def _walk(value: Any, path: str, name: str, typed: bool) -> Iterator[tuple[str, str]]:
    """``typed``: ``value`` is a model's field (its type is known); else a free-form JSON value, where
    ``1e18`` for ``training.steps`` is still a float and is checked as the integer it will become."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            yield path, f"must be a finite number, got {value}"
            return
        if typed or not value.is_integer():
            return
        value = int(value)
    if isinstance(value, int):
        bound = bound_for(name)
        if value > bound.maximum:
            yield path, f"{value} is above the upper bound {bound.maximum} of {bound.rule} fields (api/limits.py)"
        elif bound.minimum is not None and value < bound.minimum:
            yield path, f"{value} is below {bound.minimum}: a {bound.rule} must not be negative"
        elif value < -bound.maximum:
            yield path, f"{value} is below the lower bound {-bound.maximum} of {bound.rule} fields"
        return
    if isinstance(value, BaseModel):
        items = [(field, getattr(value, field)) for field in type(value).model_fields]
        items += list((value.model_extra or {}).items())
        for field, item in items:
            yield from _walk(item, f"{path}.{field}" if path else field, field, typed=True)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            key = str(key)
            yield from _walk(item, f"{path}.{key}" if path else key, key.rsplit(".", 1)[-1], typed=False)
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            # A list's items are named by the list's field (grid.seed.0 is a seed).
            yield from _walk(item, f"{path}.{index}", name, typed=typed)
