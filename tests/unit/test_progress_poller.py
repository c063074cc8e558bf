"""The progress poller's status writes (controller/progress.py): throttled by the interval, while the
in-memory report the hang policy and the reconcile read stays fresh at every poll."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import pytest

from phalanx.controller import progress as progress_module
from phalanx.controller.progress import ProgressPoller, ProgressTarget


class RecordingWriter:
    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    def write_facts(self, key: str, uid: str, patch: dict[str, Any]) -> bool:
        self.writes.append(patch)
        return True


class NoQueue:
    def enqueue_threadsafe(self, key: str) -> None:
        pass


class Trainer:
    """What rank 0's /progress answers, and a clock the test moves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.report: dict[str, Any] = {"step": 1, "total_steps": 100}
        self.now = 1000.0
        monkeypatch.setattr(progress_module.urllib.request, "urlopen", self.urlopen)
        monkeypatch.setattr(progress_module.time, "monotonic", lambda: self.now)

    def urlopen(self, url: str, timeout: float) -> io.BytesIO:
        return io.BytesIO(json.dumps(self.report).encode())


@pytest.fixture
def trainer(monkeypatch: pytest.MonkeyPatch) -> Trainer:
    return Trainer(monkeypatch)


def poller(writer: RecordingWriter, seconds: float) -> ProgressPoller:
    polling = ProgressPoller(writer, NoQueue(), status_seconds=seconds)  # type: ignore[arg-type]
    polling.targets["ns/job"] = ProgressTarget("uid-1", "10.0.0.1")
    return polling


def test_progress_reaches_status_once_per_interval_but_memory_sees_every_step(trainer: Trainer) -> None:
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    for step in range(1, 31):  # one poll a second for 30 s, a new step each time
        trainer.report["step"] = step
        polling.poll("ns/job")
        assert polling.trainer_reports["ns/job"][1]["step"] == step  # hang detection reads this
        trainer.now += 1.0
    trainer.report["step"] = 31
    polling.poll("ns/job")
    assert [w["progress"]["step"] for w in writer.writes] == [1, 31]


def test_a_new_checkpoint_is_written_at_once(trainer: Trainer) -> None:
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    polling.poll("ns/job")
    trainer.now += 1.0
    trainer.report.update(step=2, last_checkpoint={"step": 2, "time": "2026-01-01T00:00:00Z"})
    polling.poll("ns/job")
    assert [w.get("lastCheckpoint", {}).get("step") for w in writer.writes] == [None, 2]


def test_the_progress_the_interval_held_back_is_read_until_a_write_carries_it(trainer: Trainer) -> None:
    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    polling.poll("ns/job")
    trainer.now += 1.0
    trainer.report["step"] = 100
    polling.poll("ns/job")
    assert len(writer.writes) == 1
    assert polling.held_back("ns/job", "other-uid") is None  # never onto another job
    newest = {"step": 100, "totalSteps": 100, "percent": 100}
    assert polling.held_back("ns/job", "uid-1") == newest
    polling.written_with_status("ns/job", "uid-1", {"step": 99})  # a write that carried another
    assert polling.held_back("ns/job", "uid-1") == newest  # a conflict or another value: still held
    polling.written_with_status("ns/job", "uid-1", newest)
    assert polling.held_back("ns/job", "uid-1") is None


def test_the_interval_comes_from_the_environment() -> None:
    from phalanx.settings import OperatorSettings

    assert OperatorSettings.from_environment({}).progress_status_seconds == 30.0
    configured = OperatorSettings.from_environment({"PHALANX_PROGRESS_STATUS_SECONDS": "2"})
    assert configured.progress_status_seconds == 2.0
    with pytest.raises(ValueError, match="PHALANX_PROGRESS_STATUS_SECONDS"):
        OperatorSettings.from_environment({"PHALANX_PROGRESS_STATUS_SECONDS": "0"})


def test_the_backfill_reads_the_eta_the_interval_held_back(trainer: Trainer) -> None:
    from phalanx.controller.admission_pass import AdmissionPass
    from phalanx.controller.stores import ClusterStores

    writer = RecordingWriter()
    polling = poller(writer, seconds=30.0)
    trainer.report["eta_seconds"] = 600
    polling.poll("ns/job")  # written: the status says 600 s
    trainer.now += 20.0
    trainer.report.update(step=50, eta_seconds=580)
    polling.poll("ns/job")  # held back by the interval
    passing = AdmissionPass(None, ClusterStores(), None, None, None, None, None, time.time)  # type: ignore[arg-type]
    passing.fresh_progress = polling.held_back
    job = {"metadata": {"name": "job", "namespace": "ns", "uid": "uid-1"},
           "status": {"phase": "Running", "progress": writer.writes[0]["progress"]}}  # fmt: skip
    assert passing._freshest_status(job)["progress"]["etaSeconds"] == 580
    other = {**job, "metadata": {**job["metadata"], "uid": "uid-2"}}  # a job re-created by name
    assert passing._freshest_status(other)["progress"]["etaSeconds"] == 600


def test_a_new_checkpoint_is_stamped_with_the_operators_time_once(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Growth compares it with status.admittedTime, the operator's clock too (policy/elastic.py).
    monkeypatch.setattr(progress_module.time, "time", lambda: 1_800_000_000.0)
    writer = RecordingWriter()
    polling = poller(writer, seconds=0.0)
    trainer.report.update(step=2, last_checkpoint={"step": 2, "time": "2000-01-01T00:00:00Z"})
    polling.poll("ns/job")
    assert writer.writes[-1]["lastCheckpoint"]["observedTime"] == "2027-01-15T08:00:00Z"
    monkeypatch.setattr(progress_module.time, "time", lambda: 1_800_000_100.0)
    trainer.report.update(step=3)
    trainer.now += 1.0
    polling.poll("ns/job")  # the same checkpoint: when it was first seen stays
    assert writer.writes[-1]["lastCheckpoint"]["observedTime"] == "2027-01-15T08:00:00Z"


def test_a_checkpoint_the_status_holds_keeps_its_observed_time_after_an_operator_restart(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress_module.time, "time", lambda: 1_800_000_100.0)
    writer = RecordingWriter()
    polling = ProgressPoller(writer, NoQueue(), status_seconds=0.0)  # type: ignore[arg-type]
    stored = {"step": 2, "time": "2000-01-01T00:00:00Z", "observedTime": "2027-01-15T07:00:00Z"}
    rank0 = {"metadata": {"name": "job-worker-0", "labels": {"phalanx.dev/attempt": "0",
                                                             "phalanx.dev/replica-index": "0"}},
             "status": {"podIP": "10.0.0.1"}}  # fmt: skip
    polling.track("ns/job", "uid-1", [rank0], {"phase": "Running", "attempt": 0, "lastCheckpoint": stored})
    trainer.report.update(step=3, last_checkpoint={"step": 2, "time": "2000-01-01T00:00:00Z"})
    polling.poll("ns/job")
    assert writer.writes[-1]["lastCheckpoint"]["observedTime"] == "2027-01-15T07:00:00Z"


class RecordingQueue:
    def __init__(self) -> None:
        self.enqueued: list[str] = []

    def enqueue_threadsafe(self, key: str) -> None:
        self.enqueued.append(key)


def test_a_new_checkpoint_written_wakes_the_reconcile_once(trainer: Trainer) -> None:
    # A decision reads it (an elastic gang grows only after a checkpoint since its admission): the
    # job's own status events do not enqueue it, so the poller that wrote it does.
    writer, queue = RecordingWriter(), RecordingQueue()
    polling = ProgressPoller(writer, queue, status_seconds=0.0)  # type: ignore[arg-type]
    polling.targets["ns/job"] = ProgressTarget("uid-1", "10.0.0.1")
    polling.poll("ns/job")
    assert queue.enqueued == []
    trainer.report.update(step=2, last_checkpoint={"step": 2, "time": "2026-01-01T00:00:00Z"})
    trainer.now += 1.0
    polling.poll("ns/job")
    assert queue.enqueued == ["ns/job"]
    trainer.report.update(step=3)
    trainer.now += 1.0
    polling.poll("ns/job")  # progress only: no reconcile for it
    assert queue.enqueued == ["ns/job"]


def test_last_checkpoint_is_not_bookkeeping_a_decision_reads_it() -> None:
    from phalanx.controller.reconciler import BOOKKEEPING_FIELDS

    assert "lastCheckpoint" not in BOOKKEEPING_FIELDS
