"""Batches of distinct prompts for RL steps, reshuffled every epoch and resumable to the batch."""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Sequence
from typing import Any

from workers.problem import Problem

logger = logging.getLogger(__name__)


class PromptSampler:
    """An endless iterator of ``prompts_per_step`` distinct problems per batch.

    Epoch ``e`` visits the problems in a permutation drawn from (seed, e) alone, so the batch sequence is
    a pure function of (problems, prompts_per_step, seed) and ``state_dict()`` needs only the epoch and
    the position inside it. Batches never straddle two epochs (that could repeat a problem within a
    batch); the ``len(problems) % prompts_per_step`` problems left at an epoch's end wait for the next
    shuffle, which leaves different ones out.
    """

    def __init__(self, problems: Sequence[Problem], prompts_per_step: int, seed: int = 0) -> None:
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be at least 1, got {prompts_per_step}")
        if prompts_per_step > len(problems):
            raise ValueError(
                f"prompts_per_step: {prompts_per_step} distinct prompts per step, "
                f"but the training set holds only {len(problems)}"
            )
        self._problems = list(problems)
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.epoch = 0
        self.position = 0  # batches already taken from the current epoch
        self._fingerprint = _fingerprint(self._problems)
        self._order = self._permutation(self.epoch)

    @property
    def steps_per_epoch(self) -> int:
        return len(self._problems) // self.prompts_per_step

    def __iter__(self) -> PromptSampler:
        return self

    def __next__(self) -> list[Problem]:
        if self.position == self.steps_per_epoch:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        start = self.position * self.prompts_per_step
        self.position += 1
        return [self._problems[index] for index in self._order[start : start + self.prompts_per_step]]

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and strings (JSON- and checkpoint-safe)."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "prompts_per_step": self.prompts_per_step,
            "num_problems": len(self._problems),
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the saved sampler stopped; refuses a different dataset or batch size."""
        for key, current in (
            ("num_problems", len(self._problems)),
            ("fingerprint", self._fingerprint),
            ("prompts_per_step", self.prompts_per_step),
        ):
            if state[key] != current:
                raise ValueError(
                    f"{key}: the checkpoint was taken with {state[key]!r}, this sampler has {current!r}; "
                    "resuming would not replay the same batches"
                )
        if state["epoch"] < 0:
            raise ValueError(f"epoch: {state['epoch']} is negative")
        if not 0 <= state["position"] <= self.steps_per_epoch:
            raise ValueError(f"position: {state['position']} outside 0..{self.steps_per_epoch}")
        if state["seed"] != self.seed:
            logger.info(
                "PromptSampler: resuming with the checkpoint's seed %d, not %d", state["seed"], self.seed
            )
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._order = self._permutation(self.epoch)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self._problems)))
        # A string seed is hashed with SHA-512 by `random`, so it is stable across processes and Python runs.
        random.Random(f"prompt-sampler:{self.seed}:{epoch}").shuffle(order)
        return order


def _fingerprint(problems: list[Problem]) -> str:
    """Identifies the problem list by ids and order, so a resume with other data is caught."""
    digest = hashlib.sha256()
    for problem in problems:
        digest.update(problem.id.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]
