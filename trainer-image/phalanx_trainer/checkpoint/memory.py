"""A rank's state kept in its pod's memory between restart generations (the I/O; decisions in memory_plan.py).

The resident launcher outlives its workers but cannot hold their tensors: a forked worker's memory
(and a GPU's) goes with it. So at an agreed stop each worker copies its state into the pod's
memory-backed /dev/shm (the launcher makes one folder per pod incarnation: pod_memory.py), and the
next generation's worker reads it back at memory speed instead of from checkpoint storage. A new pod
starts with an empty folder, as a replacement on a real cluster does.

Memory is the cost: tmpfs pages count against the pod's limit and cannot be reclaimed. So a snapshot
is written only when it fits a share of what is left (per local rank), streamed to the file while it
is hashed (no second copy in a buffer), read back through mmap, and freed at the next restore. The
header is claimed (removed) before the data is read: a worker that dies while restoring leaves no
snapshot for the next generation to trip over again.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import torch
from torch.distributed.tensor import DTensor

from phalanx_trainer.checkpoint.memory_plan import SnapshotHeader, tensor_signature
from phalanx_trainer.pod_memory import cgroup_memory_headroom

log = logging.getLogger(__name__)

# A snapshot takes at most this share of the memory left, split between the pod's local ranks.
MAX_SHARE_OF_FREE = 0.5
# For the stop's time budget: a device-to-host copy, the tmpfs write, SHA-256 and torch.save's own
# CRC32 (0.3-0.5 GB/s measured on the 2-core development machine), conservatively.
ASSUMED_BYTES_PER_SECOND = 3e8
SMALL_KEY = "__phalanx_small_state__"
HASH_CHUNK = 8 * 1024 * 1024


def local_data(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this rank holds: a DTensor's local shard, or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def signature_of(tensors: Mapping[str, torch.Tensor]) -> str:
    return tensor_signature(
        {key: (tuple(local_data(t).shape), str(local_data(t).dtype)) for key, t in tensors.items()}
    )


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """What torch.save should write for `tensor`: its own elements only. A CPU view would otherwise
    drag its whole storage along (FSDP's padded shards), and a device tensor must come to the host."""
    data = local_data(tensor).detach()
    if data.device.type != "cpu":
        return data.cpu()
    if data.untyped_storage().nbytes() != data.numel() * data.element_size():
        return data.clone()
    return data


class _HashingFile:
    """A write-only file that hashes what goes through it (torch.save needs only write/flush)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


class StateMemory:
    """This rank's snapshot in `folder` (None: nothing kept here). Files are named by local rank, so
    a pod whose ranks are renumbered overwrites (and frees) its own. `replicated`: every rank holds
    the same model and optimizer state (plain DDP), so a rank without a snapshot may receive one."""

    def __init__(
        self,
        folder: Path | None,
        rank: int,
        generation: int,
        *,
        local_rank: int = 0,
        local_ranks: int = 1,
        replicated: bool = False,
    ) -> None:
        self.folder = folder
        self.rank = rank
        self.generation = generation
        self.local_rank = local_rank
        self.local_ranks = max(1, local_ranks)
        self.replicated = replicated

    def _path(self, suffix: str) -> Path:
        assert self.folder is not None
        return self.folder / f"local-{self.local_rank}{suffix}"

    def claim(self) -> SnapshotHeader | None:
        """This rank's header, removed as it is read: a restore that dies halfway cannot be retried
        from the same snapshot. None when there is none, or it does not parse."""
        if self.folder is None:
            return None
        path = self._path(".json")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            return None
        finally:
            path.unlink(missing_ok=True)
        return SnapshotHeader.from_json(text)

    def budget_bytes(self) -> float:
        """What one local rank's snapshot may take: a share of the filesystem's and the cgroup's room."""
        assert self.folder is not None
        stats = os.statvfs(self.folder)
        room = min(float(stats.f_bavail * stats.f_frsize), cgroup_memory_headroom())
        return MAX_SHARE_OF_FREE * room / self.local_ranks

    def write(
        self,
        *,
        step: int,
        checkpoint: str,
        save_id: str,
        root: str,
        world_size: int,
        small_state: bytes,
        tensors: Mapping[str, torch.Tensor],
        seconds_left: float = math.inf,
    ) -> SnapshotHeader | None:
        """Copies this rank's tensors and per-rank state in; returns the header, or None when skipped."""
        if self.folder is None or not self.folder.is_dir():  # no folder, or the launcher removed it
            return None
        self.discard()  # the older snapshot is never needed again, and its memory is
        size = sum(local_data(t).numel() * local_data(t).element_size() for t in tensors.values())
        size += len(small_state)
        try:
            budget = self.budget_bytes()
        except OSError as error:
            log.warning("state not kept in memory (%s); the next generation reads checkpoint storage", error)
            return None
        if size > budget or size / ASSUMED_BYTES_PER_SECOND > seconds_left:
            log.warning(
                "state not kept in memory: %d bytes, against a share of %.0f bytes of memory left and "
                "%.1f s of the stop's budget; the next generation reads checkpoint storage",
                size,
                budget,
                seconds_left,
            )
            return None
        partial = self._path(".pt.partial")
        try:
            payload = {key: _host_copy(tensor) for key, tensor in tensors.items()}
            payload[SMALL_KEY] = torch.frombuffer(bytearray(small_state), dtype=torch.uint8)
            with open(partial, "wb") as handle:
                hashing = _HashingFile(handle)
                torch.save(payload, hashing)  # type: ignore[arg-type]  # write/flush is all it uses
            del payload
            header = SnapshotHeader(
                step=step,
                checkpoint=checkpoint,
                save_id=save_id,
                root=root,
                generation=self.generation,
                rank=self.rank,
                world_size=world_size,
                signature=signature_of(tensors),
                sha256=hashing.digest.hexdigest(),
                size=hashing.size,
            )
            os.replace(partial, self._path(".pt"))
            header_partial = self._path(".json.partial")
            header_partial.write_text(header.to_json())
            os.replace(header_partial, self._path(".json"))  # last: complete once present
        except Exception as error:  # ENOSPC, a memory error: the stop's durable checkpoint stands
            log.warning("state not kept in memory (%s); the next generation reads checkpoint storage", error)
            self.discard()
            return None
        return header

    def read(self, header: SnapshotHeader) -> tuple[dict[str, torch.Tensor], bytes]:
        """(key -> local tensor, per-rank state bytes), the tensors mapped from the file rather than
        copied; ValueError when the data is not what the header says."""
        path = self._path(".pt")
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        if size != header.size or digest.hexdigest() != header.sha256:
            raise ValueError(f"{path} does not match its header's size and SHA-256")
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as error:  # a damaged archive; the digest makes this unlikely
            raise ValueError(f"{path} does not load: {type(error).__name__}: {error}") from None
        if not isinstance(loaded, dict) or not isinstance(loaded.get(SMALL_KEY), torch.Tensor):
            raise ValueError(f"{path} is not a state snapshot")
        small = loaded.pop(SMALL_KEY).numpy().tobytes()
        return loaded, small

    def discard(self) -> None:
        """Frees this rank's snapshot, and what a write cut short left (its memory counts against the
        pod's limit)."""
        if self.folder is None:
            return
        for suffix in (".json", ".json.partial", ".pt", ".pt.partial"):
            try:
                self._path(suffix).unlink(missing_ok=True)
            except OSError as error:
                log.warning("cannot remove %s: %s", self._path(suffix), error)
