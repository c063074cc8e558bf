"""spec.runPolicy.suspend (reconcile/rules/suspend.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_suspending_a_running_job_deletes_its_pods_and_keeps_its_status() -> None:
    status = {**RUNNING, "restarts": {"failures": 1, "preemptions": 2}}
    plan = decide(job(dict(status), runPolicy={"suspend": True}), [pod(0), pod(1)], NODES, NOW)
    assert plan.status["phase"] == "Suspended"
    assert set(plan.delete_pods) == {"j-worker-0", "j-worker-1"} and plan.create_indices == []
    assert plan.status["attempt"] == 0 and plan.status["restarts"] == {"failures": 1, "preemptions": 2}
    assert [e.reason for e in plan.events] == ["Suspended"]


def test_a_pod_already_being_deleted_is_not_deleted_again() -> None:
    going = pod(1, metadata={"deletionTimestamp": iso(NOW)})
    plan = decide(job(dict(RUNNING), runPolicy={"suspend": True}), [pod(0), going], NODES, NOW)
    assert plan.delete_pods == ["j-worker-0"]


def test_a_finished_job_is_not_suspended() -> None:
    done = {"phase": "Succeeded", "attempt": 0, "completionTime": iso(NOW - 10)}
    plan = decide(job(done, runPolicy={"suspend": True}), [], NODES, NOW)
    assert plan.status["phase"] == "Succeeded"
