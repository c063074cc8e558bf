"""A rank's state kept in its pod's memory between restart generations (the I/O; decisions in memory_plan.py).

The resident launcher outlives its workers but cannot hold their tensors: a forked worker's memory
(and a GPU's) goes with it. So at an agreed stop each worker copies its state into the pod's
memory-backed /dev/shm (the launcher makes one folder per pod incarnation: pod_memory.py), and
the next generation's worker reads it back at memory speed instead of from checkpoint storage. A new
pod starts with an empty folder, as a replacement on a real cluster does.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from phalanx_trainer.checkpoint.memory_plan import SnapshotHeader, tensor_signature

log = logging.getLogger(__name__)

# /dev/shm is a Memory emptyDir in Phalanx pods; its pages count against the pod's memory limit, so a
# snapshot takes at most this share of what the filesystem has free.
MAX_SHARE_OF_FREE = 0.5
SMALL_KEY = "__phalanx_small_state__"


def local_data(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this rank holds: a DTensor's local shard, or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def signature_of(tensors: Mapping[str, torch.Tensor]) -> str:
    return tensor_signature(
        {key: (tuple(local_data(t).shape), str(local_data(t).dtype)) for key, t in tensors.items()}
    )


class StateMemory:
    """This rank's snapshot in `folder` (None: nothing kept here). `replicated`: every rank holds the
    same model and optimizer state (plain DDP), so a rank without a snapshot may receive a peer's."""

    def __init__(self, folder: Path | None, rank: int, generation: int, *, replicated: bool = False) -> None:
        self.folder = folder
        self.rank = rank
        self.generation = generation
        self.replicated = replicated

    @property
    def _data(self) -> Path:
        assert self.folder is not None
        return self.folder / f"rank-{self.rank}.pt"

    @property
    def _header(self) -> Path:
        assert self.folder is not None
        return self.folder / f"rank-{self.rank}.json"

    def header(self) -> SnapshotHeader | None:
        if self.folder is None:
            return None
        try:
            return SnapshotHeader.from_json(self._header.read_text())
        except OSError:
            return None

    def write(
        self,
        *,
        step: int,
        checkpoint: str,
        world_size: int,
        small_state: bytes,
        tensors: Mapping[str, torch.Tensor],
    ) -> SnapshotHeader | None:
        """Copies this rank's tensors and per-rank state in; returns the header, or None when skipped."""
        if self.folder is None:
            return None
        self.discard()  # the older snapshot is never needed again, and its memory is
        payload = {key: local_data(tensor).detach().cpu() for key, tensor in tensors.items()}
        payload[SMALL_KEY] = torch.frombuffer(bytearray(small_state), dtype=torch.uint8)
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        data = buffer.getbuffer()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            stats = os.statvfs(self.folder)
            free = stats.f_bavail * stats.f_frsize
            if data.nbytes > MAX_SHARE_OF_FREE * free:
                log.warning(
                    "state not kept in memory: %d bytes exceed half of the %d free in %s; the next "
                    "generation reads checkpoint storage",
                    data.nbytes,
                    free,
                    self.folder,
                )
                return None
            header = SnapshotHeader(
                step=step,
                checkpoint=checkpoint,
                generation=self.generation,
                rank=self.rank,
                world_size=world_size,
                signature=signature_of(tensors),
                sha256=hashlib.sha256(data).hexdigest(),
                size=data.nbytes,
            )
            _write_atomically(self._data, data)
            _write_atomically(self._header, header.to_json().encode())  # last: complete once present
        except OSError as error:
            log.warning("state not kept in memory (%s); the next generation reads checkpoint storage", error)
            self.discard()
            return None
        return header

    def read(self, header: SnapshotHeader) -> tuple[dict[str, torch.Tensor], bytes]:
        """(key -> local tensor, per-rank state bytes); ValueError when the data is not what the header says."""
        data = self._data.read_bytes()
        if len(data) != header.size or hashlib.sha256(data).hexdigest() != header.sha256:
            raise ValueError(f"{self._data} does not match its header's size and SHA-256")
        try:
            loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as error:  # a damaged archive; the digest makes this unlikely
            raise ValueError(f"{self._data} does not load: {type(error).__name__}: {error}") from None
        if not isinstance(loaded, dict) or not isinstance(loaded.get(SMALL_KEY), torch.Tensor):
            raise ValueError(f"{self._data} is not a state snapshot")
        small = loaded.pop(SMALL_KEY).numpy().tobytes()
        return loaded, small

    def discard(self) -> None:
        """Frees this rank's snapshot (its memory counts against the pod's limit)."""
        if self.folder is None:
            return
        for path in (self._header, self._data):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as error:
                log.warning("cannot remove %s: %s", path, error)


def _write_atomically(path: Path, data: bytes | memoryview) -> None:
    temporary = path.with_name(f".{path.name}.partial")
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)
