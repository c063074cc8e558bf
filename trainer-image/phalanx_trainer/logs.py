"""Structured logs: one JSON object (or key=value line) per event, from global rank 0 only."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from phalanx_trainer.startup import utc_now_ms


class EventLog:
    def __init__(self, rank: int, as_json: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = rank == 0
        self.as_json = as_json
        self.stream = stream

    def __call__(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        stream = self.stream or sys.stdout
        if self.as_json:
            line = json.dumps({"time": utc_now_ms(), "event": event, **fields}, default=str)
        else:
            line = " ".join([utc_now_ms(), event, *(f"{key}={value}" for key, value in fields.items())])
        print(line, file=stream, flush=True)
