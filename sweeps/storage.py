"""Where a sweep keeps what it needs to continue after its driver, a node or the whole cluster is lost.

That durable state is the sweep's record (``sweep.json``, ``spec.yaml``), Ray Tune's experiment state, each trial's
latest checkpoint and, with a local MLflow store, MLflow's artifacts. ``--storage`` says where it goes:

- a folder (the default: ``--output-dir`` itself): on one machine, or on a cluster where every node mounts it (NFS,
  EFS); trials keep their checkpoints in their run folders and report only a small marker to Tune;
- a URI that pyarrow opens (``s3://bucket/prefix``, ``gs://…``, ``abfs://…``): an object store. Tune uploads each
  trial's checkpoint with the step's report and hands it back to the restarted attempt wherever it runs
  (``sweeps.trainable``); the run folders under ``--output-dir`` are only each node's working copies.

Credentials and the endpoint come from the store's usual environment (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``,
…), which pyarrow (Tune, the records) and boto3 (MLflow's artifacts) read alike on every node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow
import pyarrow.fs as pafs

from orchestrator.config_loader import ConfigError


@dataclass(frozen=True)
class SweepStorage:
    uri: str  # as given (a folder: its absolute path)
    filesystem: pafs.FileSystem
    root: str  # the storage's root inside ``filesystem``

    @classmethod
    def at(cls, where: str | Path) -> SweepStorage:
        text = str(where)
        if "://" not in text:
            folder = str(Path(text).expanduser().resolve())
            return cls(folder, pafs.LocalFileSystem(), folder)
        try:
            filesystem, root = pafs.FileSystem.from_uri(text)
        except (pyarrow.ArrowException, OSError, ValueError) as exc:
            raise ConfigError(f"--storage: {text!r} is neither a folder nor a URI pyarrow can open ({exc})") from None
        return cls(text, filesystem, root.rstrip("/"))

    @property
    def remote(self) -> bool:
        """True for an object store: checkpoints travel through Tune, since no node sees another's disk."""
        return not isinstance(self.filesystem, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        """A path inside ``filesystem`` (what Tune's ``storage_path`` takes beside ``storage_filesystem``)."""
        return "/".join([self.root, *parts])

    def uri_of(self, *parts: str) -> str:
        """A URI for other readers (MLflow's artifact root): the scheme and the path, without pyarrow's query
        options (those readers take the endpoint from the environment)."""
        if not self.remote:
            return Path(self.path(*parts)).as_uri()
        return f"{urlsplit(self.uri).scheme}://{self.path(*parts)}"

    def exists(self, *parts: str) -> bool:
        return self.filesystem.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def read_text(self, *parts: str) -> str:
        with self.filesystem.open_input_stream(self.path(*parts)) as stream:
            return stream.read().decode()

    def write_text(self, text: str, *parts: str) -> None:
        target = self.path(*parts)
        self.filesystem.create_dir(target.rsplit("/", 1)[0], recursive=True)
        with self.filesystem.open_output_stream(target) as stream:  # an object appears whole, at close
            stream.write(text.encode())

    def folders_holding(self, name: str) -> list[str]:
        """The names of the top-level folders that hold a file ``name`` (each sweep's folder holds its record)."""
        try:
            entries = self.filesystem.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except OSError as exc:  # unreachable store, no such bucket, no permission
            raise ConfigError(f"--storage: cannot list {self.uri}: {exc}") from None
        folders = [Path(entry.path).name for entry in entries if entry.type == pafs.FileType.Directory]
        return sorted(folder for folder in folders if self.exists(folder, name))
