"""Which objects a TrainingJob may treat as its own (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.policy.ownership import controller_uid, is_owned_by

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
