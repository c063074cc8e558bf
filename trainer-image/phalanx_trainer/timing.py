"""Phase times of one step that mean what they say on an accelerator.

CUDA kernels run asynchronously: a host clock read after `backward()` returns measures the launch,
and the backward's real time lands in whichever later phase first waits on the device. On CUDA the
marks are CUDA events recorded on the current stream and read once per step, after the last one has
completed; on CPU the host clock is the truth.
"""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    """`mark()` at each phase boundary of a step, then `seconds()` gives the time between the marks."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._host: list[float] = []
        self._events: list[torch.cuda.Event] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self._events.append(event)
        else:
            self._host.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Seconds between consecutive marks (waits for the device on CUDA); starts a new step."""
        if self.cuda:
            events, self._events = self._events, []
            if not events:
                return []
            events[-1].synchronize()
            return [start.elapsed_time(end) / 1000.0 for start, end in zip(events, events[1:], strict=False)]
        host, self._host = self._host, []
        return [end - start for start, end in zip(host, host[1:], strict=False)]
