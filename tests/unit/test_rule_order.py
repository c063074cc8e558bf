"""Which rule wins when two apply (reconcile/lifecycle.py's order), shown by what decide() does."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_a_deadline_that_passed_fails_the_job_even_when_a_worker_failed_retryably() -> None:
    # Restarting would give the job more time than activeDeadlineSeconds allows.
    spec = {"runPolicy": {"activeDeadlineSeconds": 30, "backoffLimit": 3}}
    plan = decide(job(dict(RUNNING), **spec), [pod(0), pod(1, phase="Failed", exit_code=137)], NODES, NOW)
    assert plan.status["phase"] == "Failed"
    assert any(c["reason"] == "DeadlineExceeded" for c in plan.status["conditions"])


def test_suspension_wins_over_a_worker_failure() -> None:
    spec = {"runPolicy": {"suspend": True, "backoffLimit": 3}}
    plan = decide(job(dict(RUNNING), **spec), [pod(0), pod(1, phase="Failed", exit_code=137)], NODES, NOW)
    assert plan.status["phase"] == "Suspended"
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 0}


def test_a_finished_job_stays_finished_whatever_its_spec_now_says() -> None:
    done = {**RUNNING, "phase": "Succeeded", "completionTime": RUNNING["startTime"]}
    plan = decide(job(done, runPolicy={"suspend": True}), [pod(0, phase="Succeeded"), pod(1, phase="Succeeded")],
                  NODES, NOW)  # fmt: skip
    assert plan.status["phase"] == "Succeeded" and not plan.delete_pods
