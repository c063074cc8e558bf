"""Goodput booking on every decision (reconcile/rules/goodput.py; the ledger: policy/goodput.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_a_new_job_starts_its_ledger_with_its_devices() -> None:
    created = job()
    created["metadata"]["creationTimestamp"] = iso(NOW - 30)
    plan = decide(created, [], NODES, NOW)
    ledger = plan.status["goodput"]
    assert ledger["unit"] and ledger["devices"] == "2" and ledger["ratio"] == "0.000"


def test_running_time_is_booked_as_productive() -> None:
    # A later attempt: the first one's time waits for its trainer's first report (policy/goodput.py).
    ledger = {"unit": "pod", "devices": "2", "accountedTime": iso(NOW - 100)}
    running = job({**RUNNING, "attempt": 1, "createdAttempt": 1, "goodput": ledger})
    running["metadata"]["creationTimestamp"] = iso(NOW - 100)
    plan = decide(running, [pod(0, attempt=1), pod(1, attempt=1)], NODES, NOW)
    assert plan.status["goodput"]["productiveSeconds"] == 200  # 100 s x 2 devices
