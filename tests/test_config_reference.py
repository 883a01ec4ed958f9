"""docs/config-reference.md is generated from the pydantic models and must not go stale."""

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_config_reference_is_in_sync_with_the_models():
    render = runpy.run_path(str(ROOT / "scripts" / "config_reference.py"))["render"]
    expected = render()
    assert "`selection.ratio`" in expected and "`learner.zero_stage`" in expected and "`grid.method`" in expected
    assert (ROOT / "docs" / "config-reference.md").read_text() == expected, (
        "docs/config-reference.md is stale: run `python scripts/config_reference.py > docs/config-reference.md`"
    )
