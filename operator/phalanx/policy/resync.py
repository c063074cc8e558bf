"""Which jobs the periodic resync looks at in each tick of its period (pure).

A resync of every job at once put thousands of reconciles in the queue in one moment, every period:
a burst of CPU and API reads that delayed the reconciles events asked for. Each job gets a fixed
slot in the period instead, from a stable hash of its uid, so the same share of jobs comes each tick
and every job still comes once a period.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from typing import Final

# Every job is looked at once per period (the progress sample's write rides on it too,
# policy/progress_writes.py): RESYNC_SECONDS while that is at most RESYNC_PER_SECOND reconciles a
# second; beyond, the period grows in steps of RESYNC_SECONDS, up to MAX_RESYNC_SECONDS. A running
# job with nothing to decide costs a reconcile and a status write per period, and at thousands of
# jobs those were most of the operator's steady CPU; events, timers and the poller's checkpoint
# writes do not wait for the resync, so only the status sample of progress gets older.
RESYNC_SECONDS: Final = 20.0
RESYNC_PER_SECOND: Final = 25.0
MAX_RESYNC_SECONDS: Final = 120.0


def resync_period(jobs: int, current: float | None = None) -> float:
    """Seconds in which every one of `jobs` jobs is resynced once. Given the `current` period, a
    shorter one is taken only once the count is a tenth below where it would grow again, so a count
    hovering at a step does not change the slots (and who is due) every few seconds."""
    steps = max(1, math.ceil(jobs / RESYNC_PER_SECOND / RESYNC_SECONDS))
    period = min(MAX_RESYNC_SECONDS, steps * RESYNC_SECONDS)
    if current is not None and period < current and resync_period(math.ceil(jobs / 0.9)) >= current:
        return current
    return period


def resync_slot(uid: str, slots: int) -> int:
    """The tick of the period (0 .. slots-1) at which the job with `uid` is resynced; the same in
    every process and run (crc32, not Python's salted hash)."""
    return zlib.crc32(uid.encode()) % slots


def due_for_resync(jobs: Iterable[tuple[str, str]], tick: int, slots: int) -> list[str]:
    """The keys of the (key, uid) jobs whose slot is this tick of the period."""
    return [key for key, uid in jobs if resync_slot(uid, slots) == tick % slots]
