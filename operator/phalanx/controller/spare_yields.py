"""Warm spares asked to give their room to a waiting gang: a thread-safe hand-off, no decision.

The admission pass chooses them (gang/preemption.py, idle spares before any gang). It does not
delete them itself: the spare's own job's reconcile, which runs one at a time per job, deletes each
one still standing by (reconcile/rules/spares.py) and never one a takeover has given a lost rank
meanwhile (reconcile/rules/in_place.py skips spares asked to yield). Asks are by the spare pod's
uid: a later spare under the same name is another pod. An ask is held until its job is forgotten or
YIELD_HOLD_SECONDS pass: long enough for the spare's grace period, so that its loss is not booked as
a failing spare (the replacement backoff).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

YIELD_HOLD_SECONDS: Final = 600.0


class SpareYields:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._asked: dict[str, dict[str, tuple[str, float]]] = {}  # job key -> pod uid -> (why, when)

    def ask(self, job_key: str, pod_uid: str, why: str) -> bool:
        """True when this spare was not asked already (or its ask had expired)."""
        now = self._clock()
        with self._lock:
            asked = self._asked.setdefault(job_key, {})
            held = asked.get(pod_uid)
            new = held is None or now - held[1] >= YIELD_HOLD_SECONDS
            if new:
                asked[pod_uid] = (why, now)
            return new

    def of(self, job_key: str) -> dict[str, str]:
        """The job's spares asked to yield (pod uid -> why), the expired ones dropped."""
        now = self._clock()
        with self._lock:
            asked = self._asked.get(job_key)
            if not asked:
                return {}
            kept = {uid: entry for uid, entry in asked.items() if now - entry[1] < YIELD_HOLD_SECONDS}
            if kept:
                self._asked[job_key] = kept
            else:
                del self._asked[job_key]
            return {uid: why for uid, (why, _) in kept.items()}

    def forget(self, job_key: str) -> None:
        with self._lock:
            self._asked.pop(job_key, None)
