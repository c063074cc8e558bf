"""Every worker exited 0 (reconcile/rules/success.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from phalanx.reconcile.rules.success import complete_progress
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_every_worker_succeeded_makes_the_job_succeed() -> None:
    plan = decide(
        job(dict(RUNNING)),
        [pod(0, phase="Succeeded", exit_code=0), pod(1, phase="Succeeded", exit_code=0)],
        NODES,
        NOW,
    )
    assert plan.status["phase"] == "Succeeded" and plan.status["completionTime"] == iso(NOW)


def test_a_succeeded_job_shows_its_progress_complete() -> None:
    status = {**RUNNING, "progress": {"step": 990, "totalSteps": 1000, "percent": 99, "etaSeconds": 4}}
    done = [pod(0, phase="Succeeded", exit_code=0), pod(1, phase="Succeeded", exit_code=0)]
    plan = decide(job(status), done, NODES, NOW)
    assert plan.status["progress"] == {"step": 1000, "totalSteps": 1000, "percent": 100, "etaSeconds": 0}


def test_progress_without_a_total_is_left_as_reported() -> None:
    status = {"phase": "Succeeded", "progress": {"step": 5}}
    complete_progress(status)
    assert status["progress"] == {"step": 5}
