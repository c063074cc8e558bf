"""activeDeadlineSeconds (reconcile/rules/deadline.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_deadline_fails_the_job() -> None:
    plan = decide(job(dict(RUNNING), runPolicy={"activeDeadlineSeconds": 30}), [pod(0), pod(1)], NODES, NOW)
    assert plan.status["phase"] == "Failed"
    assert any(c["reason"] == "DeadlineExceeded" for c in plan.status["conditions"])
