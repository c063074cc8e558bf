"""The work queue: de-duplicated TrainingJob keys, the workers that reconcile them, and the
thread-safe hand-off from the threads that see events (reflectors, kopf's pool) to the event loop.

Everything in WorkQueue but the *_threadsafe methods and from_watch runs on the event loop, the one
thread that owns the queue and its sets. One key is never reconciled by two workers at once: a key
enqueued while its reconcile runs is marked `again` and reconciled once more when it finishes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from phalanx import constants as c
from phalanx import metrics
from phalanx.k8s import short_error
from phalanx.policy.job_events import event_marker

log = logging.getLogger("phalanx.controller")

RETRY_BASE_SECONDS: Final = 2.0
RETRY_MAX_SECONDS: Final = c.RETRY_MAX_SECONDS
# Pod events of one job come in bursts (a gang is created, admitted, bound and started together):
# one reconcile per burst, not one per event.
POD_EVENT_BATCH_SECONDS: Final = 1.0
# Lanes: what an event or a decision asked for first, the periodic resync after it. Thousands of
# resync keys must never stand between a failed pod and its reconcile.
EVENT_LANE: Final = 0
RESYNC_LANE: Final = 1


class WorkQueue:
    def __init__(self, retry_max_seconds: float = RETRY_MAX_SECONDS) -> None:
        self.retry_max_seconds = retry_max_seconds
        # (lane, order, key); a key moved up to the event lane leaves a stale resync entry behind,
        # skipped when taken (queued says which lane holds the key now).
        self.queue: asyncio.PriorityQueue[tuple[int, int, str]] = asyncio.PriorityQueue()
        self.queued: dict[str, int] = {}
        self._order = itertools.count()
        self.active: set[str] = set()
        self.again: set[str] = set()
        self.batching: dict[str, asyncio.TimerHandle] = {}  # key -> its pod-event batch's timer
        self.job_markers: dict[str, tuple[Any, ...]] = {}  # the last kopf event's marker per job
        self.failures: dict[str, int] = {}  # reconciles failed in a row, per key
        # At most one pending delayed requeue per key, the earliest asked for: a reconcile asks for
        # the follow-ups it still needs each time, so a later timer would only repeat the earlier.
        self.delayed: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        # Set when room may have freed or a gang may wait: the admission pass runs soon.
        self.admission_dirty = asyncio.Event()
        # Pod events arrive on the reflector's thread many per second; they are handed to the loop in
        # bunches (one wake-up per bunch instead of one per event).
        self.from_watch_lock = threading.Lock()
        self.from_watch_jobs: set[str] = set()
        self.from_watch_admission = False

    loop: asyncio.AbstractEventLoop  # set before the first event (handlers.configure)

    # -- on the event loop ------------------------------------------------------------------------
    def enqueue(self, key: str, delay: float = 0.0, resync: bool = False) -> None:
        if delay > 0:
            self._enqueue_later(key, delay)
            return
        if key in self.active:
            self.again.add(key)  # reconcile once more after the running one finishes
            return
        lane = RESYNC_LANE if resync else EVENT_LANE
        if self.queued.get(key, RESYNC_LANE + 1) > lane:
            self.queued[key] = lane
            self.queue.put_nowait((lane, next(self._order), key))

    def _taken(self, entry: tuple[int, int, str]) -> str | None:
        """The key of a queue entry, or None for a stale one (the key moved up a lane, or was taken)."""
        lane, _, key = entry
        if self.queued.get(key) != lane:
            return None
        del self.queued[key]
        return key

    def take_nowait(self) -> str | None:
        """The next key, as a worker would take it; None when nothing is queued (tests)."""
        while not self.queue.empty():
            key = self._taken(self.queue.get_nowait())
            if key is not None:
                return key
        return None

    def _enqueue_later(self, key: str, delay: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        pending = self.delayed.get(key)
        if pending is not None and pending[0] <= due:
            return  # an earlier look is already due
        if pending is not None:
            pending[1].cancel()

        def fire() -> None:
            self.delayed.pop(key, None)
            self.enqueue(key)

        self.delayed[key] = (due, loop.call_later(delay, fire))

    def job_event(self, key: str, body: Mapping[str, Any]) -> None:
        """kopf's event for a job (on the loop): reconcile unless only its status changed."""
        marker = event_marker(body)
        if self.job_markers.get(key) == marker:
            return  # a status write (ours, mostly): nothing the reconcile decides on changed
        self.job_markers[key] = marker
        self.enqueue(key)

    def enqueue_batched(self, key: str) -> None:
        """Reconcile once POD_EVENT_BATCH_SECONDS from the first of a burst of events."""
        if key in self.batching or key in self.queued:
            return

        def due() -> None:
            self.batching.pop(key, None)
            self.enqueue(key)

        self.batching[key] = asyncio.get_running_loop().call_later(POD_EVENT_BATCH_SECONDS, due)

    def forget(self, key: str) -> None:
        """The job is gone (from any thread): drop what is kept for it, its pending timer included
        (a finished job's TTL or a retry's backoff would otherwise hold it for minutes)."""
        self.job_markers.pop(key, None)
        self.failures.pop(key, None)
        loop = getattr(self, "loop", None)
        if loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._cancel_delayed(key)
        else:  # a timer is the loop's
            loop.call_soon_threadsafe(self._cancel_delayed, key)

    def _cancel_delayed(self, key: str) -> None:
        pending = self.delayed.pop(key, None)
        if pending is not None:
            pending[1].cancel()
        batch = self.batching.pop(key, None)  # its pod-event batch: the job's pods go with it
        if batch is not None:
            batch.cancel()

    async def run_worker(self, reconcile: Callable[[str], list[float]], pool: ThreadPoolExecutor) -> None:
        """One worker: takes keys off the queue and reconciles them in `pool`; reconcile returns the
        delays after which to look at the key again. A failed reconcile is retried with backoff."""
        loop = asyncio.get_running_loop()
        while True:
            taken = self._taken(await self.queue.get())
            if taken is None:
                continue
            key = taken
            if key in self.active:  # never two reconciles of one key at once
                self.again.add(key)
                continue
            self.active.add(key)
            try:
                with metrics.reconcile_timer("trainingjob"):
                    followups = await loop.run_in_executor(pool, reconcile, key)
                self.failures.pop(key, None)
                for delay in followups:
                    self.enqueue(key, delay=delay)
            except Exception as exc:  # a failed reconcile is retried, never fatal
                # Backing off: a job in a namespace being deleted is refused (403) until it is gone.
                failures = self.failures[key] = self.failures.get(key, 0) + 1
                delay = min(self.retry_max_seconds, RETRY_BASE_SECONDS * 2 ** (failures - 1))
                log.warning("reconcile of %s failed (%d in a row), retrying in %.0fs: %s",
                            key, failures, delay, short_error(exc))  # fmt: skip
                self.enqueue(key, delay=delay)
            finally:
                self.active.discard(key)
                if key in self.again:
                    self.again.discard(key)
                    self.enqueue(key)

    # -- from any thread --------------------------------------------------------------------------
    def enqueue_threadsafe(self, key: str) -> None:
        self.loop.call_soon_threadsafe(self.enqueue, key)

    def admission_dirty_threadsafe(self) -> None:
        self.loop.call_soon_threadsafe(self.admission_dirty.set)

    def from_watch(self, job: str | None, admission_dirty: bool) -> None:
        """A pod event (reflector thread): batch-reconcile its job, and/or wake the admission pass.
        One wake-up of the loop per bunch of events."""
        with self.from_watch_lock:
            wake = not self.from_watch_jobs and not self.from_watch_admission
            if job is not None:
                self.from_watch_jobs.add(job)
            self.from_watch_admission |= admission_dirty
        if wake:
            self.loop.call_soon_threadsafe(self._take_watch_events)

    def _take_watch_events(self) -> None:
        with self.from_watch_lock:
            jobs, self.from_watch_jobs = self.from_watch_jobs, set()
            dirty, self.from_watch_admission = self.from_watch_admission, False
        for job in jobs:
            self.enqueue_batched(job)
        if dirty:
            self.admission_dirty.set()
