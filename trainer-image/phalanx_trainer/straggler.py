"""Which ranks are stragglers (pure): slower than `factor` times the median of the other ranks for
`steps` logged steps in a row.

What is compared is each rank's own work of a step before it has to wait for anyone: its data wait
plus its forward passes (train.py times them per micro-batch). A slow device, a throttled host or a
slow data loader shows there. Backward and the optimizer are left out: under data parallelism the
gradient all-reduce sits in backward, where every fast rank waits for the slow one, so all step
times come out equal. Under tensor parallelism or FSDP the forward holds collectives too and a slow
rank slows its group's forward alike: it then shows as lower throughput, not as a straggler.
Pipeline stages do different work by design and are not compared (the trainer turns this off).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

MAX_REPORTED: Final = 8  # /progress stays small however large the gang


@dataclass(frozen=True)
class Straggler:
    rank: int
    ratio: float  # its time over the median of the other ranks', this step
    steps: int  # logged steps in a row it has been over the factor

    def as_json(self) -> dict[str, float | int]:
        return {"rank": self.rank, "ratio": round(self.ratio, 2), "steps": self.steps}


class StragglerTracker:
    def __init__(self, factor: float, steps: int) -> None:
        if factor <= 1.0:
            raise ValueError(f"metrics.straggler_factor: expected more than 1.0, got {factor}")
        if steps < 1:
            raise ValueError(f"metrics.straggler_steps: expected 1 or more, got {steps}")
        self.factor = factor
        self.steps = steps
        self.in_a_row: dict[int, int] = {}

    def update(self, seconds: Sequence[float]) -> list[Straggler]:
        """One logged step's time per rank (index = global rank); the ranks that now count as
        stragglers, slowest first, at most MAX_REPORTED."""
        found: list[Straggler] = []
        for rank, value in enumerate(seconds):
            others = [s for r, s in enumerate(seconds) if r != rank]
            median = statistics.median(others) if others else 0.0
            slow = median > 0 and value > self.factor * median
            self.in_a_row[rank] = self.in_a_row.get(rank, 0) + 1 if slow else 0
            if self.in_a_row[rank] >= self.steps:
                found.append(Straggler(rank, value / median, self.in_a_row[rank]))
        return sorted(found, key=lambda s: -s.ratio)[:MAX_REPORTED]
