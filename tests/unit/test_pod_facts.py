"""What a pod says about itself (pure): ownership, attempt, index, gate, finished, deleting."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx import constants as c
from phalanx.pod_facts import (
    controller_uid,
    is_deleting,
    is_gated,
    is_owned_by,
    is_ready,
    is_terminal,
    job_of_pod,
    pod_attempt,
    pod_index,
)

pytestmark = pytest.mark.unit

JOB_UID = "job-uid"


def obj(*owners: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "j-worker-0", "labels": labels or {}, "ownerReferences": list(owners)}}


def owner(uid: str, controller: bool | None = True) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "apiVersion": "phalanx.dev/v1alpha1",
        "kind": "TrainingJob",
        "name": "j",
        "uid": uid,
    }
    if controller is not None:
        ref["controller"] = controller
    return ref


def test_what_the_job_controls_is_its_own() -> None:
    assert is_owned_by(obj(owner(JOB_UID)), JOB_UID)
    assert controller_uid(obj(owner(JOB_UID))) == JOB_UID


def test_another_controller_is_a_conflict() -> None:
    assert not is_owned_by(obj(owner("other")), JOB_UID)


def test_no_controller_is_a_conflict_whatever_the_labels() -> None:
    labelled = obj(labels={"phalanx.dev/job-name": "j", "phalanx.dev/attempt": "0"})
    assert controller_uid(labelled) == "" and not is_owned_by(labelled, JOB_UID)
    # An owner reference that is not the controller does not make the job its controller.
    assert not is_owned_by(obj(owner(JOB_UID, controller=False)), JOB_UID)
    assert not is_owned_by(obj(owner(JOB_UID, controller=None)), JOB_UID)


def labelled_pod(**labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "j-worker-1", "namespace": "team", "labels": labels}}


def test_job_attempt_and_index_come_from_the_labels() -> None:
    pod = labelled_pod(**{c.LABEL_JOB_NAME: "j", c.LABEL_ATTEMPT: "2", c.LABEL_REPLICA_INDEX: "1"})
    assert (job_of_pod(pod), pod_attempt(pod), pod_index(pod)) == ("team/j", 2, 1)


def test_a_pod_without_readable_labels_belongs_to_no_attempt_or_index() -> None:
    for pod in (labelled_pod(), labelled_pod(**{c.LABEL_ATTEMPT: "x", c.LABEL_REPLICA_INDEX: ""})):
        assert (job_of_pod(pod), pod_attempt(pod), pod_index(pod)) == (None, -1, -1)


def test_only_the_gang_gate_counts_as_gated() -> None:
    gate = {"spec": {"schedulingGates": [{"name": "other.io/queue"}, {"name": c.GANG_SCHEDULING_GATE}]}}
    assert is_gated(gate)
    assert not is_gated({"spec": {"schedulingGates": [{"name": "other.io/queue"}]}})
    assert not is_gated({"spec": {}}) and not is_gated({})


@pytest.mark.parametrize(("phase", "terminal"), [("Succeeded", True), ("Failed", True), ("Running", False),
                                                   ("Pending", False), ("Unknown", False), (None, False)])  # fmt: skip
def test_terminal_phases(phase: str | None, terminal: bool) -> None:
    assert is_terminal({"status": {"phase": phase}}) is terminal


def test_ready_means_running_with_the_ready_condition_true() -> None:
    ready = {"type": "Ready", "status": "True"}
    assert is_ready({"status": {"phase": "Running", "conditions": [ready]}})
    assert not is_ready({"status": {"phase": "Running", "conditions": [{**ready, "status": "False"}]}})
    assert not is_ready({"status": {"phase": "Succeeded", "conditions": [ready]}})
    assert not is_ready({})


def test_deleting_once_a_deletion_timestamp_is_set() -> None:
    assert is_deleting({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert not is_deleting({"metadata": {}}) and not is_deleting({})
