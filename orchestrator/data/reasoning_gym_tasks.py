"""Procedural reasoning tasks from reasoning-gym (``reasoning_gym.create_dataset``), offline and seeded.

Each problem keeps what a verifier needs to score it with the task's own scorer:
``metadata = {"dataset": name, "entry": <entry, JSON-safe>, "config": {size, seed, **kwargs}}``.
``reasoning_gym.create_dataset(name, **config)[entry["metadata"]["source_index"]]`` rebuilds the original
entry exactly; that matters for scorers that compare tuples (``arc_agi``, ``rearc``), which JSON turns
into lists.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.data.config import ReasoningGymOptions, Split
from workers.problem import Problem

# reasoning-gym draws entry i from Random(seed + i). The test split starts this far along (validation twice
# as far), so their generators never reuse a training seed for any realistic size. Tasks with few distinct puzzles can
# still repeat a question across splits by chance.
TEST_SEED_OFFSET = 1_000_000_007
SPLIT_SEED_OFFSETS = {"train": 0, "validation": 2 * TEST_SEED_OFFSET, "test": TEST_SEED_OFFSET}


def reasoning_gym_problems(options: ReasoningGymOptions, split: Split, size: int, seed: int) -> list[Problem]:
    import reasoning_gym  # Imported here: ~1 s, and only runs that use reasoning-gym pay it.

    task_seed = seed + SPLIT_SEED_OFFSETS[split]
    config = {"size": size, "seed": task_seed, **options.kwargs}
    dataset = reasoning_gym.create_dataset(options.dataset, **config)
    return [
        Problem(
            id=f"{options.dataset}-{split}-{task_seed}-{index}",
            prompt=entry["question"],
            # Tasks with many valid answers (graph_color, rubiks_cube, …) have none: their scorer
            # checks validity.
            answer="" if entry["answer"] is None else str(entry["answer"]),
            domain="reasoning_gym",
            metadata={"dataset": options.dataset, "entry": json_safe(entry), "config": json_safe(config)},
        )
        for index, entry in enumerate(dataset)
    ]


def json_safe(value: Any) -> Any:
    """A copy made of dicts with string keys, lists, strings, numbers, booleans and None.

    Entries travel through Ray, MLflow and JSONL files; tuples become lists and non-string keys strings,
    exactly as ``json.dumps`` would write them. Anything JSON cannot hold is an error, not a silent str().
    """
    return json.loads(json.dumps(value))
