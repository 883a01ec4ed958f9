"""A checkpoint folder's files as bytes, for learner ranks whose node does not see the run's disk.

With node-local disks (a sweep whose storage is an object store: ``checkpoint.node_local``) a rank on another node
than the run's driver writes its part of a DeepSpeed checkpoint where only it can read it, and at resume finds
nothing where the driver put the restored checkpoint. The group (``LearnerGroup``) moves the files through Ray's
object store: the other nodes' files to the driver after a save, the whole folder to them before a load.
"""

from __future__ import annotations

import os
from pathlib import Path


def files_under(folder: str | Path) -> dict[str, bytes]:
    """Every file under ``folder``, by its path relative to it."""
    root = Path(folder)
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def write_files(folder: str | Path, files: dict[str, bytes]) -> None:
    """Write ``files`` under ``folder``, each whole or not at all (a temporary name, then a rename); a file already
    there is left as it is (this node wrote it, or shares the disk with the node that did)."""
    root = Path(folder)
    for relative, data in files.items():
        target = root / relative
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        partial.write_bytes(data)
        partial.replace(target)
