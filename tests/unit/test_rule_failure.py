"""A failed worker: fail, or restart within backoffLimit (reconcile/rules/failure.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_retryable_failure_counts_until_the_backoff_limit() -> None:
    crashed = [pod(0), pod(1, phase="Failed", exit_code=137)]
    plan = decide(job(dict(RUNNING), runPolicy={"backoffLimit": 1}), crashed, NODES, NOW)
    assert plan.status["restarts"]["failures"] == 1 and plan.status["phase"] == "Restarting"
    spent = {**RUNNING, "restarts": {"failures": 1, "preemptions": 0}}
    plan = decide(job(spent, runPolicy={"backoffLimit": 1}), crashed, NODES, NOW)
    assert plan.status["phase"] == "Failed"
    assert any(
        c["type"] == "Failed" and c["reason"] == "BackoffLimitExceeded" for c in plan.status["conditions"]
    )


def test_permanent_exit_code_fails_at_once_and_stops_the_rest() -> None:
    plan = decide(job(dict(RUNNING)), [pod(0), pod(1, phase="Failed", exit_code=2)], NODES, NOW)
    assert plan.status["phase"] == "Failed" and plan.delete_pods == ["j-worker-0"]


def test_listed_retryable_exit_code_restarts_instead_of_failing() -> None:
    plan = decide(
        job(dict(RUNNING), runPolicy={"retryableExitCodes": [2]}),
        [pod(0), pod(1, phase="Failed", exit_code=2)],
        NODES,
        NOW,
    )
    assert plan.status["phase"] == "Restarting" and plan.status["restarts"]["failures"] == 1
