"""SIGTERM handling: stop at a step boundary that every rank agrees on."""

from __future__ import annotations

import signal
import time
from types import FrameType


class PreemptionWatcher:
    """Records SIGTERM; `agreed_stop()` all-reduces the flag so every rank stops at the same step."""

    def __init__(self) -> None:
        self.received_at: float | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()

    def agreed_stop(self, process_group: object = None) -> bool:
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if self.received_at is not None else 0.0])
        if dist.is_available() and dist.is_initialized():
            group = process_group if isinstance(process_group, dist.ProcessGroup) else None
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item() > 0)
