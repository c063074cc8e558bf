"""What a running, undisturbed job costs in status writes (issue 17 item 3): the progress poller
(controller/progress.py) and the reconcile's resync (controller/reconciler.py) together, on a fake
API server and a clock the test moves. The goal: at most one status write per 30 s per job, with
the goodput ledger still booked to the second."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import pytest

from phalanx import constants as c
from phalanx.controller import progress as progress_module
from phalanx.controller.composition import Controller
from phalanx.policy.goodput import device_seconds
from phalanx.policy.recovery_timeline import parse_time
from phalanx.policy.resync import RESYNC_SECONDS
from phalanx.reconcile.plan import iso
from phalanx.settings import OperatorSettings
from tests.unit.progress_answers import answer_with

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
KEY = "ns/steady"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class FakeApi:
    """The job's status as the API server keeps it; every status write counted."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.status_writes: list[tuple[float, dict[str, Any]]] = []
        self.clock: Clock | None = None

    def _apply(self, patch: dict[str, Any]) -> dict[str, Any]:
        assert self.clock is not None
        self.status_writes.append((self.clock.now, patch))
        status = self.job.setdefault("status", {})
        _merge(status, patch)
        meta = self.job["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return copy.deepcopy(self.job)

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any], rv: str) -> dict[str, Any]:
        assert rv == self.job["metadata"]["resourceVersion"], "decided on an older version"
        return self._apply(status)

    def patch_job_facts(
        self, namespace: str, name: str, status: dict[str, Any], uid: str, rv: str | None,
        retry_on_conflict: bool = True,
    ) -> dict[str, Any]:  # fmt: skip
        return self._apply(status)

    def create_event(self, *args: Any) -> None:
        pass

    def priority_values(self) -> dict[str, int]:
        return {}


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def running_job() -> dict[str, Any]:
    container = {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {
        "apiVersion": f"{c.GROUP}/{c.VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": "steady", "namespace": "ns", "uid": "uid-1", "generation": 1,
                     "resourceVersion": "1", "creationTimestamp": iso(T0 - 120)},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [container]}}},
        "status": {"attempt": 1, "createdAttempt": 1, "phase": "Running", "admittedTime": iso(T0 - 100),
                   "startTime": iso(T0 - 100), "observedGeneration": 1},
    }  # fmt: skip


def pod(index: int) -> dict[str, Any]:
    labels = {c.LABEL_JOB_NAME: "steady", c.LABEL_REPLICA_INDEX: str(index), c.LABEL_ATTEMPT: "1",
              c.LABEL_GANG_SIZE: "2"}  # fmt: skip
    return {
        "metadata": {"name": f"steady-worker-{index}", "namespace": "ns", "uid": f"pod-{index}",
                     "resourceVersion": "1", "labels": labels,
                     "ownerReferences": [{"controller": True, "uid": "uid-1", "kind": "TrainingJob",
                                          "name": "steady"}]},
        "spec": {"nodeName": "n0", "containers": [{"name": "trainer"}]},
        "status": {"phase": "Running", "podIP": f"10.0.0.{index + 1}",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


class Steady:
    """One running job: its trainer answers every poll with a new step (one a second); the poller
    polls when its policy says the job is due, the resync reconciles it once per RESYNC_SECONDS, and
    whatever the poller enqueues is reconciled at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str] | None = None) -> None:
        self.clock = Clock()
        self.api = FakeApi(running_job())
        self.api.clock = self.clock
        settings = OperatorSettings.from_environment(environ or {})
        self.controller = Controller(self.api, settings, clock=self.clock)  # type: ignore[arg-type]
        stores = self.controller.stores
        node = {"metadata": {"name": "n0", "resourceVersion": "1"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "allocatable": {"nvidia.com/gpu": "8"}}}  # fmt: skip
        stores.nodes.upsert(node)
        for index in (0, 1):
            stores.pods.upsert(pod(index))
        stores.jobs.upsert(copy.deepcopy(self.api.job))
        for store in (stores.jobs, stores.pods, stores.nodes):
            store.synced.set()
        self.enqueued: list[str] = []
        monkeypatch.setattr(self.controller.work, "enqueue_threadsafe", self.enqueued.append)
        answer_with(monkeypatch, self.urlopen)
        monkeypatch.setattr(progress_module.time, "monotonic", self.clock)
        monkeypatch.setattr(progress_module.time, "time", self.clock)
        self.polls = 0

    def urlopen(self, url: str, timeout: float) -> io.BytesIO:
        self.polls += 1
        step = int(self.clock.now - T0)
        report = {"step": step, "total_steps": 1_000_000, "eta_seconds": 1_000_000 - step,
                  "seconds_per_step": 1.0, "attempt": 1}  # fmt: skip
        return io.BytesIO(json.dumps(report).encode())

    def reconcile(self) -> None:
        self.controller.reconciler.reconcile(KEY)

    def run(self, seconds: int) -> None:
        poller = self.controller.progress
        self.reconcile()  # the job as the operator first sees it: the poller starts tracking it
        for second in range(1, seconds + 1):
            self.clock.now = T0 + second
            if poller.next_poll.get(KEY, float("-inf")) <= self.clock.now:
                poller.poll(KEY)
            if second % int(RESYNC_SECONDS) == 0 or self.enqueued:
                self.enqueued.clear()
                self.reconcile()

    def writes_after(self, start: float) -> list[tuple[float, dict[str, Any]]]:
        return [(at, patch) for at, patch in self.api.status_writes if at > start]


def test_a_steady_running_job_costs_at_most_one_status_write_per_30_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = Steady(monkeypatch)
    minutes = 10
    job.run(60 * (minutes + 1))
    # After the first minute (the first report, the first booking): progress, goodput and anything
    # else together.
    writes = job.writes_after(T0 + 60)
    assert len(writes) <= minutes * 2, [(at - T0, sorted(patch)) for at, patch in writes]


def test_the_status_still_shows_recent_progress_and_a_ledger_booked_to_the_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = Steady(monkeypatch)
    job.run(600)
    status = job.api.job["status"]
    assert job.clock.now - job.api.status_writes[-1][0] <= 60  # written at least once a minute
    assert status["progress"]["step"] >= 600 - 60  # the sample is at most a minute old
    ledger = status["goodput"]
    accounted = parse_time(ledger["accountedTime"])
    assert accounted is not None and job.clock.now - accounted <= 60
    # Every second from the job's creation to the last booking: productive, 2 GPUs (attempt 1 of a
    # job whose ledger starts now: no first-report wait).
    booked = 2 * (accounted - (T0 - 120))
    assert device_seconds(ledger, "allocated") == pytest.approx(booked, abs=0.002)
    assert device_seconds(ledger, "productive") == pytest.approx(booked, abs=0.002)


def test_a_short_progress_interval_still_shows_every_second_in_the_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The e2e tests sample status.progress each second (tests/conftest.py sets the interval to 1 s).
    job = Steady(monkeypatch, {c.ENV_PROGRESS_STATUS_SECONDS: "1"})
    job.run(60)
    steps = [patch["progress"]["step"] for _, patch in job.api.status_writes if "progress" in patch]
    assert len(steps) >= 50 and steps[-1] >= 59


def test_the_admission_pass_skips_a_running_job_without_reading_its_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pass runs every few seconds over every job it could admit, Running ones included (a stopped
    # operator may have left one half admitted). Parsing each spec to find no pod at the gate was a
    # quarter of the operator's CPU at 2,000 running jobs (py-spy, bench/steady_state.py).
    from phalanx.controller import admission_pass

    job = Steady(monkeypatch)
    job.reconcile()
    looked_at: list[str] = []
    real = admission_pass.waiting_gang
    monkeypatch.setattr(
        admission_pass, "waiting_gang", lambda key, *rest: looked_at.append(key) or real(key, *rest)
    )
    job.controller.admission.admission_pass()
    assert looked_at == []
