"""The last recovery's timeline, as every decision keeps it (reconcile/rules/recovery.py)."""

from __future__ import annotations

import pytest

from phalanx.policy.recovery_timeline import is_complete, iso_ms
from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_a_preemption_opens_the_timeline_and_the_first_step_closes_it_with_one_event() -> None:
    restarting = decide(job(dict(RUNNING)), [pod(0), pod(1, phase="Failed", exit_code=75)], NODES, NOW)
    opened = restarting.status["lastRecovery"]
    assert opened["attempt"] == 1 and opened["reason"] == "Preempted" and not is_complete(opened)
    assert "Recovered" not in [e.reason for e in restarting.events]

    running = {
        **restarting.status,
        "phase": "Running",
        "createdAttempt": 1,
        "admittedTime": RUNNING["admittedTime"],
    }
    report = {"attempt": 1, "startup": {"first_step": iso_ms(NOW + 7)}}
    pods = [pod(0, attempt=1), pod(1, attempt=1)]
    done = decide(job(running), pods, NODES, NOW + 8, trainer_report=report)
    assert is_complete(done.status["lastRecovery"])
    assert [e.reason for e in done.events] == ["Recovered"]
    # Complete already: the next pass tells no one again.
    again = decide(job(dict(done.status)), pods, NODES, NOW + 9, trainer_report=report)
    assert again.events == [] and again.status["lastRecovery"] == done.status["lastRecovery"]


def test_without_a_restart_there_is_no_timeline() -> None:
    plan = decide(job(dict(RUNNING)), [pod(0), pod(1)], NODES, NOW)
    assert "lastRecovery" not in plan.status
