"""Whether a restart in place may resume from the ranks' memory instead of storage (pure decisions).

At an agreed stop every rank writes the durable checkpoint and, beside it, a snapshot of its own state
into its pod's memory (memory.py). The next generation uses a rank's snapshot only when it provably
holds the state the durable checkpoint holds: taken at the same step, for the same checkpoint folder,
by the same rank of a world of the same size and tensor layout, in an earlier generation. A rank
without one (the replacement of a lost pod, a spare) receives the state from a live peer when every
data-parallel rank holds the same state (DDP); otherwise the whole gang reads storage as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

SNAPSHOT_FORMAT = 1


@dataclass(frozen=True)
class SnapshotHeader:
    """What a rank's snapshot says about itself; written after the data, so its presence means complete."""

    step: int
    checkpoint: str  # the durable folder's name written at the same stop (step-00000042)
    save_id: str  # that save's id, recorded in its manifest: a folder rewritten since has another
    root: str  # the checkpoint root: a memory folder shared by two jobs cannot mix them
    generation: int
    rank: int
    world_size: int
    signature: str  # tensor_signature of the tensors it holds
    sha256: str  # of the data file
    size: int
    format: int = SNAPSHOT_FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> SnapshotHeader | None:
        """None for anything that is not a complete header of this format."""
        try:
            raw = json.loads(text)
            header = SnapshotHeader(**raw)
        except (ValueError, TypeError):
            return None
        if header.format != SNAPSHOT_FORMAT:
            return None
        ints = (header.step, header.generation, header.rank, header.world_size, header.size)
        if not all(isinstance(value, int) for value in ints):
            return None
        return header


@dataclass(frozen=True)
class Expected:
    """What this rank of the new generation is about to resume."""

    step: int
    checkpoint: str
    save_id: str  # from the folder's manifest; "" when it records none (then nothing is usable)
    root: str
    generation: int
    rank: int
    world_size: int
    signature: str


def tensor_signature(shapes: Mapping[str, tuple[Sequence[int], str]]) -> str:
    """One digest of every tensor's key, local shape and dtype: equal layouts give equal signatures."""
    canonical = json.dumps({key: [list(shape), dtype] for key, (shape, dtype) in sorted(shapes.items())})
    return hashlib.sha256(canonical.encode()).hexdigest()


def why_unusable(header: SnapshotHeader | None, expected: Expected) -> str | None:
    """None when the snapshot holds exactly what `expected` resumes; else the reason, for the log."""
    if header is None:
        return "no snapshot in this pod's memory"
    if header.generation >= expected.generation:
        return f"snapshot of generation {header.generation}, not older than {expected.generation}"
    if header.root != expected.root:
        return f"snapshot of the checkpoints under {header.root}, not {expected.root}"
    if header.checkpoint != expected.checkpoint or header.step != expected.step:
        return f"snapshot of {header.checkpoint} (step {header.step}); the gang resumes {expected.checkpoint}"
    if not expected.save_id or header.save_id != expected.save_id:
        return f"{expected.checkpoint} is not the save the snapshot was taken with (written again since)"
    if header.rank != expected.rank or header.world_size != expected.world_size:
        return (
            f"snapshot of rank {header.rank} of {header.world_size}; "
            f"this is rank {expected.rank} of {expected.world_size}"
        )
    if header.signature != expected.signature:
        return "snapshot's tensors differ in key, shape or dtype from this rank's"
    return None


@dataclass(frozen=True)
class MemoryPlan:
    """Every rank not in `receivers` loads its own snapshot; the receivers get the state from `source`."""

    source: int | None
    receivers: tuple[int, ...]

    @property
    def describe(self) -> str:
        return "memory+peer" if self.receivers else "memory"


def plan_memory_restore(usable: Sequence[bool], replicated: bool) -> MemoryPlan | None:
    """The gang's plan from each rank's verdict (index = rank); None: everyone reads storage.

    `replicated`: the model and optimizer are the same on every rank (DDP), so rank 0 can send them to
    the ranks without a snapshot. Rank 0 only: it wrote them to the durable checkpoint, and a model's
    buffers (BatchNorm statistics) may differ between replicas until DDP's next forward. Losing rank 0
    (the store host) means a full restart anyway.
    """
    if not usable:
        return None
    if all(usable):
        return MemoryPlan(source=None, receivers=())
    if not replicated or not usable[0]:
        return None
    return MemoryPlan(source=0, receivers=tuple(rank for rank, ok in enumerate(usable) if not ok))
