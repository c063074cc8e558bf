"""After a gang timeout: the job waits in Pending until status.requeueAfter (gang/backoff.py) (pure)."""

from __future__ import annotations

from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder, parse_iso


def apply(b: PlanBuilder, seen: Observed) -> bool:
    requeue = parse_iso(b.status.get("requeueAfter"))
    if requeue is None or b.now >= requeue:
        return False
    b.phase("Pending", "Backoff", f"gang timed out; retrying admission after {b.status['requeueAfter']}")
    b.recheck(requeue - b.now)
    return True
