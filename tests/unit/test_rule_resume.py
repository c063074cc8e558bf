"""Resuming after suspension (reconcile/rules/resume.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_resume_resets_the_start_time_so_the_deadline_counts_from_the_next_run() -> None:
    # Suspended for an hour with a 60 s deadline: resuming must not fail the job at once (batch/v1 Job).
    suspended = {**RUNNING, "phase": "Suspended", "startTime": iso(NOW - 3600)}
    deadline = {"activeDeadlineSeconds": 60}
    plan = decide(job(suspended, runPolicy=deadline), [], NODES, NOW)
    assert plan.status["phase"] == "Pending" and plan.status["attempt"] == 1
    assert "startTime" not in plan.status
    resumed = {**plan.status, "createdAttempt": 1, "admittedTime": iso(NOW)}
    plan = decide(job(resumed, runPolicy=deadline), [pod(0, attempt=1), pod(1, attempt=1)], NODES, NOW + 5)
    assert plan.status["phase"] == "Running" and plan.status["startTime"] == iso(NOW + 5)
    plan = decide(job(dict(plan.status), runPolicy=deadline), [pod(0, attempt=1), pod(1, attempt=1)],
                  NODES, NOW + 66)  # fmt: skip
    assert plan.status["phase"] == "Failed", "the deadline still counts from the new start"
