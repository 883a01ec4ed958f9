"""Create a cached folder atomically: build it under a temporary name, then rename it into place.

Two processes (two Ray actors, two Tune trials) may materialise the same model at once. Each builds its
own temporary folder beside the target and renames it; ``rename`` of a directory is atomic on POSIX, so a
reader sees either no folder or a complete one. The loser of the race discards its copy.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)


def build_folder_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, first calling ``build(tmp_folder)`` and renaming it to ``target`` if it is missing."""
    if target.is_dir():
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    # Same parent as the target: the rename stays on one filesystem, which is what makes it atomic.
    tmp_folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        build(tmp_folder)
        _make_readable_by_all(tmp_folder)
        try:
            os.rename(tmp_folder, target)
        except OSError:
            if not target.is_dir():
                raise
            logger.info("%s was materialised concurrently by another process; keeping that copy", target)
    finally:
        shutil.rmtree(tmp_folder, ignore_errors=True)
    return target


def _make_readable_by_all(folder: Path) -> None:
    """mkdtemp creates the folder 0700 (and some writers make 0600 files); a cache is for every process."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
