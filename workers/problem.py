"""One verifiable problem: the unit that data sources produce and reward verifiers consume."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Domain = Literal["math", "code", "choice", "arithmetic", "reasoning_gym"]


class Problem(BaseModel):
    """A prompt with everything a verifier needs to score an answer to it.

    - ``math``: ``answer`` is a LaTeX/number string checked with math-verify.
    - ``code``: ``tests`` is a HumanEval-style check program (defines ``check(candidate)``);
      ``metadata["entry_point"]`` names the function under test.
    - ``choice``: ``answer`` is the correct option letter (``"A"`` … ``"J"``).
    - ``arithmetic``: ``answer`` is an integer string, exact match of the final number.
    - ``reasoning_gym``: ``metadata["dataset"]`` names the task and ``metadata["entry"]`` holds the
      procedural entry, scored by that task's own scorer.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    prompt: str = Field(min_length=1, description="The question as the user would ask it (before any chat template).")
    answer: str = Field(description="Reference answer (see the class docstring for its form per domain).")
    domain: Domain
    tests: str | None = Field(default=None, description="Check program for code problems.")
    metadata: dict[str, Any] = Field(default_factory=dict)
