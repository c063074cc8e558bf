"""The order the operator's pod writes go out in (used by controller/gang_writes.py): gang by gang,
in admission order (higher priority first, then older, as gang/admission.py ranks gangs), each
gang's writes in the order they were asked for; Events and other bookkeeping after every pod write.

Why: creations and gate lifts share one set of writer threads. Served first come first served, a
burst of gangs interleaves, and every gang finishes near the end of the burst; served gang by gang,
the head gang runs first and the median gang waits for the ones before it only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, order=True)
class GangRank:
    """Where a gang stands in admission order: compares smaller for the gang served first."""

    neg_priority: int
    created: float
    key: str

    @classmethod
    def of(cls, priority: int, created: float, key: str) -> GangRank:
        return cls(-priority, created, key)


# Sorts after every gang: bookkeeping (Events) waits for the pod writes queued with it.
BACKGROUND: Final = GangRank(2**63, float("inf"), "")


@dataclass(frozen=True)
class PendingWrite:
    rank: GangRank
    seq: int  # when it was asked for: the tie-break inside a gang (and between equal ranks)


def write_sort_key(write: PendingWrite) -> tuple[GangRank, int]:
    return (write.rank, write.seq)


def write_order(writes: Iterable[PendingWrite]) -> list[PendingWrite]:
    """The writes in the order the writer threads take them."""
    return sorted(writes, key=write_sort_key)
