"""Every relative link of the project's Markdown points at a file that exists, and every ``#anchor`` at a
heading of that file (GitHub's slugs): a front page whose links 404 is no front page."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", "node_modules", ".git", "runs", "mlruns"}
DOCS = sorted(p for p in ROOT.rglob("*.md") if not SKIP & set(p.relative_to(ROOT).parts))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = github_slug(line.lstrip("#"))
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(doc: Path) -> None:
    broken = []
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.DOTALL)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor.lower() not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.relative_to(ROOT)}")
    assert not broken, broken


def test_the_slug_rule_matches_githubs_on_known_headings() -> None:
    assert github_slug(" 2. Through a Ray cluster (`ray job submit`)") == "2-through-a-ray-cluster-ray-job-submit"
    assert github_slug(" real_model — none / ETS / GMTS on SmolLM2-135M-Instruct") == \
        "real_model--none--ets--gmts-on-smollm2-135m-instruct"
