"""When the operator is ready (pure): its stores are synced and it leads, or stands by.

"Process alive" is the liveness probe's question. Ready means more: a leader decides on complete
stores, and a standby could take over with warm ones, which it can only do if it reaches the lease.
A pod that is not ready yet is left out of the metrics Service, and a rollout waits for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Election:
    leading: bool  # holds the lease and may write now
    in_contact: bool  # the last lease round reached the API server
    holder: str  # the lease's holder as last seen ('' when none)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str  # one line for the probe's answer


def readiness(stores_synced: Mapping[str, bool], election: Election | None) -> Readiness:
    """`stores_synced`: store name -> listed at least once; `election`: None when it is off."""
    waiting = [name for name, synced in stores_synced.items() if not synced]
    if waiting:
        return Readiness(False, f"waiting for the first list of: {', '.join(waiting)}")
    if election is None:
        return Readiness(True, "stores synced; leader election off")
    if election.leading:
        return Readiness(True, "stores synced; leading")
    if election.in_contact:
        return Readiness(True, f"stores synced; standing by (lease held by {election.holder or 'nobody'})")
    return Readiness(False, "stores synced; the lease could not be read yet")
