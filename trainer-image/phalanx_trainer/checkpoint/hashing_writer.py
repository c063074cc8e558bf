"""A DCP FileSystemWriter that computes each file's SHA-256 while writing it.

Hashing on the way out costs no second read of the checkpoint. Each large write is hashed on a helper
thread while the calling thread copies the same bytes to the file (both release the GIL), so the
digest costs no time of its own where a core is free; the digest work also overlaps the disk
writeback that the final fsync waits for.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

from phalanx_trainer.checkpoint.manifest import FileEntry

# Below this a helper thread costs more than it saves.
_PARALLEL_HASH_MIN_BYTES = 1 << 20


class _HashingStream(io.RawIOBase):
    def __init__(self, raw: Any, hasher: ThreadPoolExecutor) -> None:
        super().__init__()
        self._raw = raw
        self._hasher = hasher
        self._digest = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes < _PARALLEL_HASH_MIN_BYTES:
            written: int = self._raw.write(view)
            self._digest.update(view[:written])
            self.size += written
            return written
        # The caller may reuse its buffer once write returns, so the digest is finished before that;
        # all of it is written, so that what was hashed is exactly what was written.
        hashed = self._hasher.submit(self._digest.update, view)
        offset = 0
        try:
            while offset < view.nbytes:
                offset += self._raw.write(view[offset:])
        finally:
            hashed.result()
        self.size += offset
        return offset

    def tell(self) -> int:
        return int(self._raw.tell())

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


class _HashingFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[str, FileEntry] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        name = Path(path).name
        with open(path, mode, buffering=0) as raw, ThreadPoolExecutor(1, "checkpoint-hash") as hasher:
            stream = _HashingStream(raw, hasher)
            yield stream
            self.entries[name] = FileEntry(name, stream.size, stream.hexdigest())


class HashingFileSystemWriter(FileSystemWriter):
    """FileSystemWriter whose `entries` holds name -> FileEntry for every file this rank wrote."""

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._hashing = _HashingFileSystem()
        self.fs = self._hashing

    @property
    def entries(self) -> dict[str, FileEntry]:
        entries = dict(self._hashing.entries)
        if ".metadata.tmp" in entries:  # the coordinator writes .metadata.tmp, then renames it
            entry = entries.pop(".metadata.tmp")
            entries[".metadata"] = FileEntry(".metadata", entry.size, entry.sha256)
        return entries
