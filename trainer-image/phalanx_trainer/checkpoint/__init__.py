"""Distributed checkpoints: sharded (DCP), asynchronous, verified by manifest, atomic commit.

This is the interface the training loop uses (see api.py and docs/checkpoints.md). The manager is
imported on first use so that reading a config (the launcher, the operator's tests) does not pay
for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx_trainer.checkpoint.preemption import PreemptionWatcher
from phalanx_trainer.checkpoint.records import CheckpointConfig, CheckpointError, CheckpointInfo

if TYPE_CHECKING:
    from phalanx_trainer.checkpoint.manager import CheckpointManager

__all__ = ["CheckpointConfig", "CheckpointError", "CheckpointInfo", "CheckpointManager", "PreemptionWatcher"]


def __getattr__(name: str) -> Any:
    if name == "CheckpointManager":
        from phalanx_trainer.checkpoint.manager import CheckpointManager

        return CheckpointManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
