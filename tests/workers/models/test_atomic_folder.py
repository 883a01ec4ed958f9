from pathlib import Path

import pytest

from workers.models.atomic_folder import build_folder_once


def _write(text: str):
    def build(folder: Path) -> None:
        (folder / "weights.txt").write_text(text)

    return build


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.endswith(".tmp")]


def test_builds_once_and_reuses_the_folder(tmp_path: Path):
    target = tmp_path / "model"
    assert build_folder_once(target, _write("first")) == target
    build_folder_once(target, _write("second"))
    assert (target / "weights.txt").read_text() == "first"
    assert _leftovers(tmp_path) == []


def test_loser_of_a_race_keeps_the_winners_complete_folder(tmp_path: Path):
    target = tmp_path / "model"

    def slow_build(folder: Path) -> None:
        (folder / "weights.txt").write_text("slow")
        # Another process finishes the same folder while this one is still writing.
        build_folder_once(target, _write("fast"))

    assert build_folder_once(target, slow_build) == target
    assert (target / "weights.txt").read_text() == "fast"
    assert _leftovers(tmp_path) == []


def test_failed_build_leaves_neither_target_nor_temporary_folder(tmp_path: Path):
    target = tmp_path / "model"

    def failing_build(folder: Path) -> None:
        (folder / "half.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_folder_once(target, failing_build)
    assert not target.exists()
    assert _leftovers(tmp_path) == []


def test_folder_and_files_get_ordinary_permissions(tmp_path: Path):
    target = build_folder_once(tmp_path / "model", _write("weights"))
    assert target.stat().st_mode & 0o755 == 0o755
    assert (target / "weights.txt").stat().st_mode & 0o644 == 0o644
