"""The project's own packaging metadata builds without setuptools warnings (a user's install shows none of ours)."""

from __future__ import annotations

import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_pyproject_applies_without_warnings() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), PYPROJECT)
    # Only what reading our pyproject says (an import's own deprecation, e.g. pkg_resources, is not ours).
    ours = [str(w.message).splitlines()[0] for w in caught if "setuptools/config" in w.filename.replace("\\", "/")]
    assert ours == []
    assert dist.metadata.license_expression == "Apache-2.0"
