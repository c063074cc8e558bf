"""Every map the controller keeps per job or pod is pruned when its job or pod goes (issue 17): at
thousands of jobs a map that only grows is the operator's memory, job after job."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from tests.unit.test_generations import STATUS, Recorded, kept_pod, launcher, settle  # noqa: F401 - the fixture

pytestmark = pytest.mark.unit


def test_forgetting_a_job_cancels_its_pending_delayed_requeue() -> None:
    from phalanx.controller.queue import WorkQueue

    async def scenario() -> int:
        work = WorkQueue()
        work.loop = asyncio.get_running_loop()
        work.enqueue("ns/gone", delay=600.0)  # a finished job's TTL, a retry's backoff
        # The reconcile that finds the job gone forgets it on its own thread.
        forgetting = threading.Thread(target=work.forget, args=("ns/gone",))
        forgetting.start()
        forgetting.join()
        await asyncio.sleep(0.05)  # the hand-off to the loop
        return len(work.delayed)

    assert asyncio.run(scenario()) == 0


def test_forgetting_a_job_cancels_its_pending_pod_event_batch() -> None:
    # Its pods' deletion events start a batch as the job goes; before, the batch still fired a
    # reconcile of the deleted job a second later (a GET that answers 404).
    from phalanx.controller.queue import POD_EVENT_BATCH_SECONDS, WorkQueue

    async def scenario() -> tuple[int, str | None]:
        work = WorkQueue()
        work.loop = asyncio.get_running_loop()
        work.from_watch("ns/gone", admission_dirty=False)
        await asyncio.sleep(0.05)  # the hand-off to the loop: the batch is pending
        forgetting = threading.Thread(target=work.forget, args=("ns/gone",))
        forgetting.start()
        forgetting.join()
        await asyncio.sleep(POD_EVENT_BATCH_SECONDS + 0.1)
        return len(work.batching), work.take_nowait()

    assert asyncio.run(scenario()) == (0, None)


@pytest.mark.usefixtures("launcher")
def test_forgetting_a_job_drops_what_the_generation_publisher_told_its_pods() -> None:
    from phalanx.controller.generations import GenerationPublisher

    publisher = GenerationPublisher(Recorded())
    publisher.publish("ns/j", "job-uid", [kept_pod()], STATUS)
    settle(publisher)
    publisher.forget("ns/j")
    assert len(publisher._told) == 0


def test_victims_past_the_preemption_cooldown_leave_the_preempting_map() -> None:
    from phalanx.controller.preemption import PREEMPTION_COOLDOWN_SECONDS, Preemptor

    preemptor = Preemptor(None, None, None, None, None, time.time)  # type: ignore[arg-type]
    now = time.monotonic()
    # A victim that restarted and runs again is never forgotten (its job is not deleted).
    preemptor.preempting = {"ns/long-ago": now - 10 * PREEMPTION_COOLDOWN_SECONDS, "ns/just-now": now}
    head: Any = None
    preemptor.preempt_for(head, [], [], {})  # within the cooldown of ns/just-now: nothing chosen
    assert list(preemptor.preempting) == ["ns/just-now"]


class _Usage:
    def freeing(self) -> dict[str, Any]:
        return {}


class _Stores:
    usage = _Usage()

    def own_pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        return []


class _State:
    def priority_of(self, spec: Any) -> int:
        return 0


class _Work:
    def __init__(self) -> None:
        self.enqueued: list[str] = []

    def enqueue_threadsafe(self, key: str) -> None:
        self.enqueued.append(key)


def test_a_victim_that_moved_on_before_it_was_stopped_is_not_chosen_again_before_the_stores_catch_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Passes run as often as every 50 ms now: without the wait, each would choose the same stale
    # victim again and write and read it once more.
    from phalanx.controller import preemption
    from phalanx.gang.preemption import PreemptionChoice

    clock = [1000.0]
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(preemption, "choose_victims", lambda *a, **k: PreemptionChoice(("ns/victim",), ()))
    work = _Work()
    preemptor = preemption.Preemptor(None, _Stores(), _State(), None, work, time.time)  # type: ignore[arg-type]
    tried: list[str] = []

    def moved_on(job: dict[str, Any], message: str) -> bool:
        tried.append(job["metadata"]["name"])
        return False  # restarted (or finished) since the store's copy

    monkeypatch.setattr(preemptor, "stop_victim", moved_on)
    victim = {"metadata": {"name": "victim", "namespace": "ns"}}
    head: Any = type("Head", (), {"key": "ns/head", "priority": 10})()
    preemptor.preempt_for(head, [victim], [], {})
    clock[0] += 0.5  # the next passes, on the same stale stores
    preemptor.preempt_for(head, [victim], [], {})
    assert tried == ["victim"]
    clock[0] += 1.0
    preemptor.preempt_for(head, [victim], [], {})
    assert tried == ["victim", "victim"]
    assert preemptor.preempting == {}  # never stopped: no cooldown of the kind a stop starts
