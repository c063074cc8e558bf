"""The hand-off from kopf's handler to the controller's queue, under threads.

kopf runs a plain `def` handler in a thread pool and an `async def` one on its event loop. Either
way, the controller must never reconcile one key in two workers at once, and every enqueued key must
be reconciled after its enqueue.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from phalanx import handlers
from phalanx.controller import Controller
from phalanx.settings import OperatorSettings

pytestmark = pytest.mark.unit


class Recorder:
    """Stands in for Controller.reconcile: notes overlaps per key and when each reconcile began."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clock = 0
        self.running: dict[str, int] = {}
        self.overlaps: list[str] = []
        self.started: dict[str, list[int]] = {}

    def tick(self) -> int:
        with self.lock:
            self.clock += 1
            return self.clock

    def reconcile(self, key: str) -> list[float]:
        with self.lock:
            self.clock += 1
            self.started.setdefault(key, []).append(self.clock)
            self.running[key] = self.running.get(key, 0) + 1
            if self.running[key] > 1:
                self.overlaps.append(key)
        time.sleep(random.uniform(0, 0.003))
        with self.lock:
            self.running[key] -= 1
        return []


@pytest.fixture
def fast_switching() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave as often as they can
    yield
    sys.setswitchinterval(before)


def deliver_like_kopf(
    loop: asyncio.AbstractEventLoop, pool: ThreadPoolExecutor, recorder: Recorder, **kwargs: Any
) -> int:
    """kopf awaits an async handler on its loop and runs a sync one in its thread pool. Returns the
    recorder's clock read on the loop once the handler returned: a reconcile must start after it."""
    handler = handlers.trainingjob_event

    async def invoke() -> int:
        if inspect.iscoroutinefunction(handler):
            await handler(**kwargs)
        else:
            await loop.run_in_executor(pool, lambda: handler(**kwargs))
        return recorder.tick()

    return asyncio.run_coroutine_threadsafe(invoke(), loop).result(timeout=10)


def test_events_from_many_threads_never_run_one_key_twice_at_once_and_none_is_lost(
    fast_switching: None,
) -> None:
    keys = [f"ns/job-{i}" for i in range(6)]
    recorder = Recorder()
    loop = asyncio.new_event_loop()
    controller = Controller(api=None, settings=OperatorSettings(), workers=8)  # type: ignore[arg-type]
    controller.reconcile = recorder.reconcile  # type: ignore[method-assign]
    memo = type("Memo", (), {"controller": controller})()
    kopf_pool = ThreadPoolExecutor(8)
    last_enqueue: dict[str, int] = {}
    generations = {key: 0 for key in keys}
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(200):
            key = random.choice(keys)
            with lock:
                generations[key] += 1  # a spec change each time: never a status-only event
                generation = generations[key]
            namespace, name = key.split("/")
            body = {"metadata": {"namespace": namespace, "name": name, "uid": "u", "generation": generation}}
            stamp = deliver_like_kopf(loop, kopf_pool, recorder, event={"type": "MODIFIED", "object": body},
                                      namespace=namespace, name=name, memo=memo)  # fmt: skip
            with lock:
                last_enqueue[key] = max(last_enqueue.get(key, 0), stamp)

    workers: list[Any] = []
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        controller.loop = loop
        workers = [
            asyncio.run_coroutine_threadsafe(controller._worker(), loop) for _ in range(controller.workers)
        ]
        senders = [threading.Thread(target=worker) for _ in range(12)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        deadline = time.monotonic() + 10
        lost = keys
        while time.monotonic() < deadline:
            with recorder.lock:
                lost = [k for k in keys if not any(s > last_enqueue[k] for s in recorder.started.get(k, []))]
            if not lost:
                break
            time.sleep(0.05)
        assert recorder.overlaps == [], f"reconciled twice at once: {sorted(set(recorder.overlaps))}"
        assert lost == [], f"enqueued but never reconciled afterwards: {lost}"
    finally:
        for running in workers:
            running.cancel()
        time.sleep(0.1)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(timeout=5)
        kopf_pool.shutdown(wait=False, cancel_futures=True)
        controller.reconcile_pool.shutdown(wait=False, cancel_futures=True)


def test_a_job_has_at_most_one_pending_delayed_requeue_the_earliest() -> None:
    from phalanx.controller.queue import WorkQueue

    async def scenario() -> tuple[int, list[str], int]:
        work = WorkQueue()
        for _ in range(100):  # every reconcile asking to look again in 0.3 s (a recheck, a retry)
            work.enqueue("ns/a", delay=0.3)
        work.enqueue("ns/a", delay=0.05)  # an earlier need replaces the later timer
        work.enqueue("ns/b", delay=0.05)
        pending = len(work.delayed)
        await asyncio.sleep(0.2)  # before the 0.3 s timers would have fired: the 0.05 s one did
        taken = []
        while (key := work.take_nowait()) is not None:
            taken.append(key)
        await asyncio.sleep(0.3)
        assert work.queue.empty()  # and the later timer was dropped, not fired too
        return pending, taken, len(work.delayed)

    pending, taken, left = asyncio.run(scenario())
    assert pending == 2  # one timer per job, not 101
    assert sorted(taken) == ["ns/a", "ns/b"] and left == 0


def test_an_event_is_reconciled_before_the_resync_backlog() -> None:
    # From the review of the steady state: the resync enqueues every job once a period; with a
    # single FIFO a pod failure waited behind thousands of resync keys (minutes at 4,000 jobs).
    from phalanx.controller.queue import WorkQueue

    async def scenario() -> list[str]:
        work = WorkQueue()
        for i in range(1000):
            work.enqueue(f"ns/resync-{i}", resync=True)
        work.enqueue("ns/resync-7")  # an event for a job the resync queued already: it moves up
        work.enqueue("ns/failed-pod")
        taken = [work.take_nowait() for _ in range(3)]
        return [k for k in taken if k is not None]

    first = asyncio.run(scenario())
    assert first[:2] == ["ns/resync-7", "ns/failed-pod"] and first[2].startswith("ns/resync-")


def test_a_key_queued_twice_is_taken_once() -> None:
    from phalanx.controller.queue import WorkQueue

    async def scenario() -> list[str | None]:
        work = WorkQueue()
        work.enqueue("ns/a", resync=True)
        work.enqueue("ns/a")
        work.enqueue("ns/a", resync=True)
        return [work.take_nowait(), work.take_nowait()]

    assert asyncio.run(scenario()) == ["ns/a", None]


def test_priority_classes_are_listed_at_most_every_refresh_and_a_failed_list_keeps_the_last() -> None:
    from phalanx.controller.admission_state import PRIORITY_REFRESH_SECONDS, PriorityValues

    calls: list[float] = []
    now = [0.0]
    answers: list[dict[str, int] | Exception] = [{"high": 1000}, RuntimeError("503"), {"high": 2000}]

    def fetch() -> dict[str, int]:
        calls.append(now[0])
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    values = PriorityValues(fetch, clock=lambda: now[0])
    assert values.current() == {"high": 1000}
    for step in range(10):  # ten passes within the refresh: no request
        now[0] = step
        assert values.current() == {"high": 1000}
    now[0] = PRIORITY_REFRESH_SECONDS
    assert values.current() == {"high": 1000}  # the list failed: last values serve
    now[0] += 1
    assert values.current() == {"high": 2000}  # tried again at the next pass
    assert len(calls) == 3


def test_a_priority_class_a_job_names_that_is_not_known_yet_is_listed_at_once() -> None:
    from phalanx.controller.admission_state import PriorityValues

    now = [0.0]
    answers = [{"low": 100}, {"low": 100, "urgent": 10_000}]
    values = PriorityValues(lambda: answers.pop(0), clock=lambda: now[0])
    assert values.current({"low"}) == {"low": 100}
    now[0] = 2.0  # a test (or a person) creates a class and submits a job naming it
    assert values.current({"low", "urgent"})["urgent"] == 10_000


def test_the_retry_cap_comes_from_the_environment_and_a_bad_value_names_the_variable() -> None:
    from phalanx.settings import OperatorSettings

    assert OperatorSettings.from_environment({}).retry_max_seconds == 60.0
    assert OperatorSettings.from_environment({"PHALANX_RETRY_MAX_SECONDS": "4"}).retry_max_seconds == 4.0
    with pytest.raises(ValueError, match="PHALANX_RETRY_MAX_SECONDS"):
        OperatorSettings.from_environment({"PHALANX_RETRY_MAX_SECONDS": "soon"})


def test_a_status_patch_removes_the_nested_keys_the_new_status_no_longer_has() -> None:
    # A merge patch merges objects: the second recovery's timeline kept the first one's phases and
    # summary when lastRecovery was sent whole (found by make bench-recovery, two evictions a job).
    from phalanx.controller.job_writes import status_diff

    old = {"attempt": 1, "lastRecovery": {"attempt": 1, "summary": "recovered in 6.1s",
                                           "phasesMilliseconds": {"podsStopped": 1150, "firstStep": 6105}}}  # fmt: skip
    new = {"attempt": 2, "lastRecovery": {"attempt": 2, "phasesMilliseconds": {}}}
    patch = status_diff(old, new)
    assert patch == {"attempt": 2, "lastRecovery": {"attempt": 2, "summary": None,
                                                    "phasesMilliseconds": {"podsStopped": None, "firstStep": None}}}  # fmt: skip

    def merge(target: object, change: object) -> object:  # RFC 7386, as the API server applies it
        if not isinstance(change, dict):
            return change
        result = dict(target) if isinstance(target, dict) else {}
        for key, value in change.items():
            if value is None:
                result.pop(key, None)
            else:
                result[key] = merge(result.get(key), value)
        return result

    assert merge(old, patch) == new


def test_once_the_priority_class_watch_has_listed_no_pass_lists_them() -> None:
    from phalanx.cache import Store, slim_priority_class
    from phalanx.controller.admission_state import PriorityValues

    calls: list[int] = []
    watched = Store(slim_priority_class)

    def fetch() -> dict[str, int]:
        calls.append(1)
        return {"high": 1000}

    values = PriorityValues(fetch, clock=lambda: 0.0, watched=watched)
    assert values.current({"high"}) == {"high": 1000}  # not listed by the watch yet: asked once
    watched.replace([{"metadata": {"name": "high", "resourceVersion": "5"}, "value": 1000}], 5)
    watched.upsert({"metadata": {"name": "urgent", "resourceVersion": "6"}, "value": 10_000})
    for _ in range(10):
        assert values.current({"high", "urgent"}) == {"high": 1000, "urgent": 10_000}
    assert len(calls) == 1
