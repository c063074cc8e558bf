"""Waiting out the backoff after a gang timeout (reconcile/rules/backoff.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, job

pytestmark = pytest.mark.unit


def test_before_requeue_after_the_job_waits_and_is_looked_at_again_then() -> None:
    status = {"attempt": 1, "phase": "Pending", "gangTimeouts": 1, "requeueAfter": iso(NOW + 30)}
    plan = decide(job(status), [], NODES, NOW)
    assert plan.create_indices == [] and plan.status["phase"] == "Pending"
    assert plan.status["message"].startswith("gang timed out; retrying admission after")
    assert plan.recheck_after == pytest.approx(30)


def test_once_requeue_after_has_passed_the_next_attempt_is_created() -> None:
    status = {"attempt": 1, "phase": "Pending", "gangTimeouts": 1, "requeueAfter": iso(NOW - 1)}
    assert decide(job(status), [], NODES, NOW).create_indices == [0, 1]
