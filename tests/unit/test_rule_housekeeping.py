"""What every decision does first (reconcile/rules/housekeeping.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_older_attempts_pods_are_deleted_once_with_their_grace_period() -> None:
    status = {**RUNNING, "attempt": 1, "createdAttempt": 1}
    old_going = pod(1, attempt=0, metadata={"deletionTimestamp": iso(NOW)})
    current = [pod(0, attempt=1), pod(1, attempt=1)]
    plan = decide(job(status), [pod(0, attempt=0), old_going, *current], NODES, NOW)
    assert plan.delete_pods == ["j-worker-0"] and plan.force_delete_pods == []


def test_replica_counters_count_the_current_attempt_only() -> None:
    pods = [pod(0), pod(1, phase="Succeeded", exit_code=0), pod(0, attempt=7, phase="Failed")]
    plan = decide(job(dict(RUNNING)), pods, NODES, NOW)
    assert plan.status["replicas"] == {"active": 1, "ready": 1, "succeeded": 1, "failed": 0}
    assert plan.status["readySummary"] == "1/2"
