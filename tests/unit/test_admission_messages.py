"""AdmissionMessages: why a gang waits reaches its status off the admission pass's thread, only the
latest reason asked is written, and never after the gang was admitted, replaced or deleted."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from phalanx import constants as c
from phalanx.controller.admission_messages import AdmissionMessages
from phalanx.controller.stores import ClusterStores

pytestmark = pytest.mark.unit

KEY = "ns/train"


def job(uid: str = "u1", message: str | None = None) -> dict[str, Any]:
    status = {"admissionMessage": message} if message is not None else {}
    return {
        "metadata": {"name": "train", "namespace": "ns", "uid": uid, "resourceVersion": "1"},
        "status": status,
    }


def pod(name: str, gated: bool, uid: str = "u1") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "trainer"}]}
    if gated:
        spec["schedulingGates"] = [{"name": c.GANG_SCHEDULING_GATE}]
    return {
        "metadata": {
            "name": name, "namespace": "ns", "resourceVersion": "1",
            "labels": {c.LABEL_JOB_NAME: "train"},
            "ownerReferences": [{"uid": uid, "controller": True, "kind": "TrainingJob", "name": "train"}],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }  # fmt: skip


class Writer:
    """Stores each message as the API server would; `hold` keeps a write waiting until released."""

    def __init__(self, stores: ClusterStores) -> None:
        self.stores = stores
        self.written: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail = False

    def write_facts(self, key: str, uid: str, patch: dict[str, Any]) -> bool:
        self.entered.set()
        self.hold.wait(5)
        if self.fail:
            raise RuntimeError("the API server is away")
        stored = self.stores.jobs.get(key)
        assert stored is not None and stored["metadata"]["uid"] == uid
        self.written.append(patch["admissionMessage"])
        self.stores.jobs.upsert({**stored, "status": {**stored["status"], **patch},
                                 "metadata": {**stored["metadata"], "resourceVersion": str(len(self.written) + 1)}})  # fmt: skip
        return True


def messages(
    gated: bool = True, stored_job: dict[str, Any] | None = None
) -> tuple[AdmissionMessages, Writer, list[str]]:
    stores = ClusterStores()
    stores.jobs.replace([stored_job or job()], 1)
    stores.pods.replace([pod("train-worker-0", gated), pod("train-worker-1", gated)], 1)
    writer = Writer(stores)
    reconciled: list[str] = []
    return AdmissionMessages(stores, writer, reconciled.append), writer, reconciled  # type: ignore[arg-type]


def settle(m: AdmissionMessages) -> None:
    """Until every write asked for has run (a replaced reason queues one more)."""
    for _ in range(100):
        m.pool.submit(lambda: None).result(5)
        if all(m.pending(k) is None for k in (KEY, "ns/other")):
            return
    raise AssertionError("the writes never settled")


def test_a_reason_is_written_to_the_waiting_job_and_its_reconcile_asked_for() -> None:
    m, writer, reconciled = messages()
    m.ask(KEY, "u1", "waiting for 16 GPUs")
    settle(m)
    assert writer.written == ["waiting for 16 GPUs"]
    assert m.stores.jobs.get(KEY)["status"]["admissionMessage"] == "waiting for 16 GPUs"  # type: ignore[index]
    assert reconciled == [KEY]
    assert m.pending(KEY) is None


def test_the_same_reason_asked_by_many_passes_is_written_once() -> None:
    m, writer, _ = messages()
    writer.hold.clear()
    for _ in range(5):
        m.ask(KEY, "u1", "waiting for 16 GPUs")
    writer.hold.set()
    settle(m)
    assert writer.written == ["waiting for 16 GPUs"]


def test_a_reason_replaced_before_its_turn_is_never_sent_and_the_latest_is() -> None:
    m, writer, _ = messages()
    writer.hold.clear()
    m.ask("ns/other", "u9", "blocks the thread")  # not stored: skipped, but it takes the thread first
    m.ask(KEY, "u1", "first")
    m.ask(KEY, "u1", "second")
    writer.hold.set()
    settle(m)
    assert writer.written == ["second"]


def test_a_reason_asked_while_an_older_one_is_being_written_follows_it_so_the_latest_stays() -> None:
    m, writer, _ = messages()
    writer.hold.clear()
    m.ask(KEY, "u1", "first")
    assert writer.entered.wait(5)  # "first" is on the wire
    m.ask(KEY, "u1", "second")
    writer.hold.set()
    settle(m)
    assert writer.written == ["first", "second"]
    assert m.stores.jobs.get(KEY)["status"]["admissionMessage"] == "second"  # type: ignore[index]


def test_an_admitted_gang_gets_no_late_waiting_message() -> None:
    m, writer, reconciled = messages(gated=False)  # its gates were lifted before the write's turn
    m.ask(KEY, "u1", "waiting for 16 GPUs")
    settle(m)
    assert writer.written == [] and reconciled == []


def test_a_reason_dropped_at_admission_is_not_written() -> None:
    m, writer, _ = messages()
    writer.hold.clear()
    m.ask("ns/other", "u9", "blocks the thread")
    m.ask(KEY, "u1", "waiting for 16 GPUs")
    m.drop(KEY)
    writer.hold.set()
    settle(m)
    assert writer.written == []


def test_a_job_deleted_and_created_again_under_its_name_does_not_get_its_predecessors_message() -> None:
    m, writer, _ = messages(stored_job=job(uid="u2"))
    m.ask(KEY, "u1", "waiting for 16 GPUs")
    settle(m)
    assert writer.written == []


def test_a_message_the_job_already_shows_is_not_written_again() -> None:
    m, writer, _ = messages(stored_job=job(message="waiting for 16 GPUs"))
    m.ask(KEY, "u1", "waiting for 16 GPUs")
    settle(m)
    assert writer.written == []


def test_a_failed_write_is_logged_and_the_next_pass_asks_again(caplog: pytest.LogCaptureFixture) -> None:
    m, writer, _ = messages()
    writer.fail = True
    m.ask(KEY, "u1", "waiting for 16 GPUs")
    m.pool.submit(lambda: None).result(5)  # the write has run
    assert "not written" in caplog.text
    assert m.pending(KEY) is None
    writer.fail = False
    m.ask(KEY, "u1", "waiting for 16 GPUs")
    settle(m)
    assert writer.written == ["waiting for 16 GPUs"]
