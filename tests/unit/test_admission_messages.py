"""AdmissionMessages: why a gang waits reaches its status off the admission pass's thread, only the
latest reason asked is written, and never after the gang was admitted, replaced or deleted, nor
over a newer version of the job."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from phalanx import constants as c
from phalanx.controller.admission_messages import AdmissionMessages, waits_at_the_gate
from phalanx.controller.stores import ClusterStores
from phalanx.k8s import StatusConflict

pytestmark = pytest.mark.unit

KEY = "ns/train"
OTHER = "ns/other"  # a second waiting job: its write holds the writer thread while KEY is asked


def job(name: str = "train", uid: str = "u1", message: str | None = None, attempt: int = 0) -> dict[str, Any]:
    status: dict[str, Any] = {"attempt": attempt}
    if message is not None:
        status["admissionMessage"] = message
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1"},
        "status": status,
    }


def pod(name: str, gated: bool, job_name: str = "train", uid: str = "u1", attempt: int = 0,
        spare: bool = False) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"containers": [{"name": "trainer"}]}
    if gated:
        spec["schedulingGates"] = [{"name": c.GANG_SCHEDULING_GATE}]
    labels = {c.LABEL_JOB_NAME: job_name, c.LABEL_ATTEMPT: str(attempt)}
    if spare:
        labels[c.LABEL_SPARE] = "true"
    return {
        "metadata": {
            "name": name, "namespace": "ns", "resourceVersion": "1", "uid": f"pod-{name}", "labels": labels,
            "ownerReferences": [{"uid": uid, "controller": True, "kind": "TrainingJob", "name": job_name}],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }  # fmt: skip


class Writer:
    """Stores each message as the API server would: on the version given, or a conflict. `hold`
    keeps every write waiting until set."""

    def __init__(self, stores: ClusterStores) -> None:
        self.stores = stores
        self.written: list[tuple[str, str]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail = False

    def write_facts(self, key: str, uid: str, patch: dict[str, Any], decided_on: str | None = None) -> bool:
        self.entered.set()
        assert self.hold.wait(5)
        if self.fail:
            raise RuntimeError("the API server is away")
        stored = self.stores.jobs.get(key)
        assert stored is not None and stored["metadata"]["uid"] == uid
        assert decided_on is not None  # a message is never written on whatever version is current
        if decided_on != stored["metadata"]["resourceVersion"]:
            raise StatusConflict(f"{key} changed")
        self.written.append((key, patch["admissionMessage"]))
        self.stores.jobs.upsert({**stored, "status": {**stored["status"], **patch},
                                 "metadata": {**stored["metadata"], "resourceVersion": str(len(self.written) + 1)}})  # fmt: skip
        return True


def messages(train_pods: list[dict[str, Any]] | None = None,
             train: dict[str, Any] | None = None) -> tuple[AdmissionMessages, Writer, list[str]]:  # fmt: skip
    stores = ClusterStores()
    stores.jobs.replace([train or job(), job("other", uid="u9")], 1)
    if train_pods is None:
        train_pods = [pod("train-worker-0", True), pod("train-worker-1", True)]
    stores.pods.replace([*train_pods, pod("other-worker-0", True, "other", "u9")], 1)
    writer = Writer(stores)
    reconciled: list[str] = []
    return AdmissionMessages(stores, writer, reconciled.append), writer, reconciled  # type: ignore[arg-type]


def writer_busy(m: AdmissionMessages, writer: Writer) -> None:
    """The writer thread is inside OTHER's write, held: what is asked now waits its turn."""
    writer.hold.clear()
    m.ask(OTHER, "u9", "blocks the thread", "1")
    assert writer.entered.wait(5)


def settle(m: AdmissionMessages) -> None:
    """Until every write asked for has run (a replaced reason queues one more)."""
    for _ in range(100):
        m.pool.submit(lambda: None).result(5)
        if all(m.pending(k) is None for k in (KEY, OTHER)):
            return
    raise AssertionError("the writes never settled")


def train_writes(writer: Writer) -> list[str]:
    return [message for key, message in writer.written if key == KEY]


def test_a_reason_is_written_to_the_waiting_job_and_its_reconcile_asked_for() -> None:
    m, writer, reconciled = messages()
    m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    settle(m)
    assert train_writes(writer) == ["waiting for 16 GPUs"]
    assert m.stores.jobs.get(KEY)["status"]["admissionMessage"] == "waiting for 16 GPUs"  # type: ignore[index]
    assert reconciled == [KEY]
    assert m.pending(KEY) is None


def test_the_same_reason_asked_by_many_passes_is_written_once() -> None:
    m, writer, _ = messages()
    writer_busy(m, writer)
    for _ in range(5):
        m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    writer.hold.set()
    settle(m)
    assert train_writes(writer) == ["waiting for 16 GPUs"]


def test_a_reason_replaced_before_its_turn_is_never_sent_and_the_latest_is() -> None:
    m, writer, _ = messages()
    writer_busy(m, writer)
    m.ask(KEY, "u1", "first", "1")
    m.ask(KEY, "u1", "second", "1")
    writer.hold.set()
    settle(m)
    assert train_writes(writer) == ["second"]


def test_a_reason_asked_while_an_older_one_is_being_written_is_not_written_over_it_unread() -> None:
    m, writer, _ = messages()
    writer.hold.clear()
    m.ask(KEY, "u1", "first", "1")
    assert writer.entered.wait(5)  # "first" is on the wire
    m.ask(KEY, "u1", "second", "1")  # decided on the same version 1, before "first" landed
    writer.hold.set()
    settle(m)
    # "second" met the version "first" made: left to the next pass, which reads that version.
    assert train_writes(writer) == ["first"]
    stored = m.stores.jobs.get(KEY)
    assert stored is not None and m.pending(KEY) is None
    m.ask(KEY, "u1", "second", stored["metadata"]["resourceVersion"])
    settle(m)
    assert train_writes(writer) == ["first", "second"]
    assert m.stores.jobs.get(KEY)["status"]["admissionMessage"] == "second"  # type: ignore[index]


def test_asking_back_the_reason_the_job_shows_cancels_a_different_one_on_its_way() -> None:
    m, writer, _ = messages(train=job(message="M1"))
    writer_busy(m, writer)
    m.ask(KEY, "u1", "M2", "1")
    m.ask(KEY, "u1", "M1", "1")  # the pass found M1 true again before M2 was written
    writer.hold.set()
    settle(m)
    assert train_writes(writer) == []
    assert m.stores.jobs.get(KEY)["status"]["admissionMessage"] == "M1"  # type: ignore[index]


def test_an_admitted_gang_gets_no_late_waiting_message() -> None:
    m, writer, reconciled = messages([pod("train-worker-0", False), pod("train-worker-1", False)])
    m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    settle(m)
    assert train_writes(writer) == [] and reconciled == []


def test_a_gated_spare_or_a_pod_of_an_earlier_attempt_does_not_make_an_admitted_gang_wait() -> None:
    admitted = [pod("train-worker-0", False, attempt=1), pod("train-worker-1", False, attempt=1)]
    lingering = [pod("train-worker-0-a0", True, attempt=0), pod("train-spare-0", True, attempt=1, spare=True)]
    m, writer, _ = messages([*admitted, *lingering], train=job(attempt=1))
    assert not waits_at_the_gate(m.stores.jobs.get(KEY), m.stores)  # type: ignore[arg-type]
    m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    settle(m)
    assert train_writes(writer) == []


def test_a_reason_dropped_at_admission_is_not_written() -> None:
    m, writer, _ = messages()
    writer_busy(m, writer)
    m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    m.drop(KEY)
    writer.hold.set()
    settle(m)
    assert train_writes(writer) == []


def test_a_job_deleted_and_created_again_under_its_name_does_not_get_its_predecessors_message() -> None:
    m, writer, _ = messages(train=job(uid="u2"))
    m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    settle(m)
    assert train_writes(writer) == []


def test_a_message_the_job_already_shows_is_not_written_again() -> None:
    m, writer, _ = messages(train=job(message="waiting for 16 GPUs"))
    m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    settle(m)
    assert train_writes(writer) == []


def test_a_reason_decided_on_an_older_version_of_the_job_is_left_for_the_next_pass_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The pass read version 1; the job has moved on to 2 (its gang admitted and the message cleared,
    # perhaps) before the writer's turn: nothing is written over it.
    moved_on = job()
    moved_on["metadata"]["resourceVersion"] = "2"
    m, writer, reconciled = messages(train=moved_on)
    m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    settle(m)
    assert train_writes(writer) == [] and reconciled == []
    assert m.pending(KEY) is None  # the next pass may ask again, on the version it reads
    assert "not written" not in caplog.text
    m.ask(KEY, "u1", "waiting for 16 GPUs", "2")
    settle(m)
    assert train_writes(writer) == ["waiting for 16 GPUs"]


def test_a_failed_write_is_logged_and_the_next_pass_asks_again(caplog: pytest.LogCaptureFixture) -> None:
    m, writer, _ = messages()
    writer.fail = True
    m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    settle(m)
    assert "not written" in caplog.text
    writer.fail = False
    m.ask(KEY, "u1", "waiting for 16 GPUs", "1")
    settle(m)
    assert train_writes(writer) == ["waiting for 16 GPUs"]
