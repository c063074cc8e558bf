"""Resumed after suspension: a fresh attempt, counted neither as failure nor as preemption (pure)."""

from __future__ import annotations

from phalanx.pod_facts import is_deleting
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder


def apply(b: PlanBuilder, seen: Observed) -> bool:
    if b.status.get("phase") != "Suspended":
        return False
    # The deadline's clock starts again when it runs (batch/v1 Job resets startTime on resume too).
    b.status["attempt"] = seen.attempt + 1
    b.status.pop("startTime", None)
    b.phase("Pending", "Resumed", "resumed after suspension; creating a new attempt")
    b.plan.delete_pods.extend(p["metadata"]["name"] for p in seen.current.values() if not is_deleting(p))
    return True
