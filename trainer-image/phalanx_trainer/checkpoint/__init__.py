"""Distributed checkpoints: sharded (DCP), asynchronous, verified by manifest, atomic commit.

This is the interface the training loop uses. Implementation: manager.py (issue 6).
"""

from phalanx_trainer.checkpoint.api import CheckpointConfig, CheckpointInfo, CheckpointManager
from phalanx_trainer.checkpoint.preemption import PreemptionWatcher

__all__ = ["CheckpointConfig", "CheckpointInfo", "CheckpointManager", "PreemptionWatcher"]
