"""Plain records shared by the checkpoint modules: configuration, last checkpoint, Stateful protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@dataclass
class CheckpointConfig:
    """Section [checkpoint] of the trainer config."""

    dir: str = ""  # empty: checkpointing off. Defaults to $PHALANX_CHECKPOINT_DIR when set.
    interval_steps: int = 0  # 0: only the final and the emergency checkpoint
    keep: int = 3  # complete checkpoints kept (>= 2)
    async_save: bool = True
    emergency_budget_seconds: float = 20.0  # skip the SIGTERM checkpoint when it would not fit
    # Bytes per second the checkpoint storage takes from the whole job (all ranks writing at once);
    # 0: measured by a short probe at start. Used to estimate the SIGTERM checkpoint before a save
    # has been measured.
    write_bytes_per_second: float = 0.0
    resume: bool = True  # take the newest valid checkpoint at start
    # Restart in place: at an agreed stop each rank also keeps its state in its pod's memory (/dev/shm),
    # and the next generation resumes from there instead of storage when it provably holds the same
    # step (checkpoint/memory_plan.py). Costs a copy of the rank's state in the pod's memory meanwhile.
    keep_in_memory: bool = True


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    time: str  # RFC 3339
    path: str
    save_id: str = ""  # the save that wrote it (its manifest's extra), "" when it recorded none


class CheckpointError(RuntimeError):
    """A save or restore that cannot go on (the message says why)."""
