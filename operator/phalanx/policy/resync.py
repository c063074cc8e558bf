"""Which jobs the periodic resync looks at in each tick of its period (pure).

A resync of every job at once put thousands of reconciles in the queue in one moment, every period:
a burst of CPU and API reads that delayed the reconciles events asked for. Each job gets a fixed
slot in the period instead, from a stable hash of its uid, so the same share of jobs comes each tick
and every job still comes once a period.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Final

# Every job is looked at once per period (the progress sample's write rides on it too,
# policy/progress_writes.py).
RESYNC_SECONDS: Final = 20.0


def resync_slot(uid: str, slots: int) -> int:
    """The tick of the period (0 .. slots-1) at which the job with `uid` is resynced; the same in
    every process and run (crc32, not Python's salted hash)."""
    return zlib.crc32(uid.encode()) % slots


def due_for_resync(jobs: Iterable[tuple[str, str]], tick: int, slots: int) -> list[str]:
    """The keys of the (key, uid) jobs whose slot is this tick of the period."""
    return [key for key, uid in jobs if resync_slot(uid, slots) == tick % slots]
