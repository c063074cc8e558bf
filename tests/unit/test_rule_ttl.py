"""ttlSecondsAfterFinished (reconcile/rules/ttl.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, job

pytestmark = pytest.mark.unit


def test_ttl_deletes_the_finished_job_when_due() -> None:
    done = {"phase": "Succeeded", "attempt": 0, "completionTime": iso(NOW - 10)}
    assert decide(job(done, runPolicy={"ttlSecondsAfterFinished": 5}), [], NODES, NOW).delete_job
    later = decide(job(done, runPolicy={"ttlSecondsAfterFinished": 60}), [], NODES, NOW)
    assert not later.delete_job and later.recheck_after == pytest.approx(50)
