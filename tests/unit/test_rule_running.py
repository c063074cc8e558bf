"""Every replica runs (reconcile/rules/running.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_a_preempted_job_running_again_is_no_longer_marked_preempted() -> None:
    preempted = {"type": "Preempted", "status": "True", "reason": "PreemptedByPriority",
                 "message": "preempted by ns/high, priority 1000", "lastTransitionTime": iso(NOW - 30)}  # fmt: skip
    status = {**RUNNING, "phase": "Admitted", "attempt": 1, "createdAttempt": 1, "conditions": [preempted]}
    plan = decide(job(status), [pod(0, attempt=1), pod(1, attempt=1)], NODES, NOW)
    assert plan.status["phase"] == "Running"
    cleared = next(c for c in plan.status["conditions"] if c["type"] == "Preempted")
    assert cleared["status"] == "False" and cleared["reason"] == "Running"
    # Between the condition and the eviction the victim still runs: the condition stays.
    plan = decide(job({**status, "phase": "Running"}), [pod(0, attempt=1), pod(1, attempt=1)], NODES, NOW)
    assert next(c for c in plan.status["conditions"] if c["type"] == "Preempted")["status"] == "True"
    # While it waits, the condition still says who preempted it.
    plan = decide(job(status), [pod(0, attempt=1, phase="Pending"), pod(1, attempt=1)], NODES, NOW)
    kept = next(c for c in plan.status["conditions"] if c["type"] == "Preempted")
    assert kept["status"] == "True" and "ns/high" in kept["message"]
