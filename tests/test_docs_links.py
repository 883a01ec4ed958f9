"""Every relative link of the project's Markdown points at a file that exists, and every ``#anchor`` at a
heading of that file (GitHub's slugs): a front page whose links 404 is no front page."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def project_markdown(root: Path) -> list[Path]:
    """The checkout's own Markdown: tracked or new, never what .gitignore names. Tools write Markdown into
    ignored folders (pytest's cache writes ``.pytest_cache/README.md`` on its first run), and a test list that
    grew by one after the first run would make two runs of the same suite disagree on its size."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.md"],
                            cwd=root, capture_output=True, text=True, check=True).stdout
    return sorted({root / name for name in listed.split("\0") if name and (root / name).is_file()})


DOCS = project_markdown(ROOT)


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


def test_the_documents_are_the_checkouts_own_markdown(tmp_path: Path) -> None:
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text(".pytest_cache/\nruns/\n")
    for name in ("README.md", "docs/usage.md", "docs/draft.md", ".pytest_cache/README.md", "runs/x/notes.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("# t\n")
    subprocess.run([*git, "add", "README.md", "docs/usage.md", ".gitignore"], cwd=tmp_path, check=True)
    found = {str(p.relative_to(tmp_path)) for p in project_markdown(tmp_path)}
    assert found == {"README.md", "docs/usage.md", "docs/draft.md"}
