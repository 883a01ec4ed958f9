"""Open registries: a config field whose values are whatever a registry holds at validation time.

``method: Registered(SELECTION_METHODS, "selection method")`` accepts any name registered before the
config is validated, so adding a method, loss aggregation, KL estimator or advantage estimator is one
decorated function (plus its test) — no closed ``Literal`` to edit beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator


def Registered(registry: Mapping[str, Any], what: str) -> Any:  # noqa: N802 (used as a type)
    def known(name: str) -> str:
        if name not in registry:
            raise ValueError(f"unknown {what} {name!r}; registered: {sorted(registry)}")
        return name

    return Annotated[str, AfterValidator(known)]
