"""The checkpoint interface the training loop calls.

Contract with train.py:
    manager = CheckpointManager(config, process_group=None)
    restored_step = manager.restore(app_state)     # None: fresh start; else the step to continue after
    ...each step...
    if manager.should_save(step): manager.save(step, app_state)
    ...on SIGTERM at a safe point (all ranks agree, see PreemptionWatcher)...
    manager.save(step, app_state, emergency=True); manager.wait(); exit(75)
    ...at the end...
    manager.save(final_step, app_state); manager.wait(); manager.close()

`app_state` maps names to objects with state_dict()/load_state_dict() (torch's Stateful protocol):
"model", "optimizer", "scheduler", "scaler", "data", "rng", "progress". "model" and "optimizer" may be
the nn.Module (plain, DDP, FSDP2, TP) and the torch.optim.Optimizer themselves: their state goes through
torch.distributed.checkpoint.state_dict and DCP (resharded on load); every other entry is saved per rank
and must be loadable with torch.load(weights_only=True). `manager.last` is the newest checkpoint
(CheckpointInfo) and `manager.status()` the dict for status.lastCheckpoint. See docs/checkpoints.md.
"""

from __future__ import annotations

from phalanx_trainer.checkpoint.manager import CheckpointManager
from phalanx_trainer.checkpoint.records import CheckpointConfig, CheckpointError, CheckpointInfo, Stateful

__all__ = ["CheckpointConfig", "CheckpointError", "CheckpointInfo", "CheckpointManager", "Stateful"]
