"""A preempted worker restarts the gang, failure budget untouched (reconcile/rules/preemption.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_preemption_restarts_the_gang_without_spending_the_failure_budget() -> None:
    evicted = pod(1, phase="Failed", exit_code=75)
    plan = decide(job(dict(RUNNING)), [pod(0), evicted], NODES, NOW)
    assert plan.status["phase"] == "Restarting"
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}
    assert plan.status["attempt"] == 1
    assert set(plan.delete_pods) == {"j-worker-0", "j-worker-1"}
    assert plan.create_indices == []


def test_a_missing_pod_after_creation_is_a_preemption() -> None:
    plan = decide(job(dict(RUNNING)), [pod(0)], NODES, NOW)
    assert plan.status["restarts"]["preemptions"] == 1


def test_disruption_condition_on_a_running_pod_restarts_nothing() -> None:
    flagged = pod(1, status={"conditions": [{"type": "Ready", "status": "True"},
                                            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]})  # fmt: skip
    plan = decide(job(dict(RUNNING)), [pod(0), flagged], NODES, NOW)
    assert plan.status["phase"] == "Running" and plan.delete_pods == []
