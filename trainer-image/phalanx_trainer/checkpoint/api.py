"""The checkpoint interface the training loop calls (first a minimal implementation; issue 6 fills it in).

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
"model", "optimizer", "scheduler", "scaler", "data", "rng", "progress". The manager decides how to
flatten model/optimizer state for DCP (torch.distributed.checkpoint.state_dict helpers).
"""

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
    resume: bool = True  # take the newest valid checkpoint at start


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    time: str  # RFC 3339
    path: str


class CheckpointManager:
    def __init__(self, config: CheckpointConfig, process_group: Any = None) -> None:
        self.config = config
        self.process_group = process_group
        self.last: CheckpointInfo | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.config.dir)

    def restore(self, app_state: dict[str, Stateful]) -> int | None:
        return None

    def should_save(self, step: int) -> bool:
        interval = self.config.interval_steps
        return self.enabled and interval > 0 and step % interval == 0

    def save(self, step: int, app_state: dict[str, Stateful], *, emergency: bool = False) -> None:
        return None

    def wait(self) -> None:
        return None

    def close(self) -> None:
        return None
