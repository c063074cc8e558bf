"""spec.runPolicy.activeDeadlineSeconds: a job running longer than that since startTime fails;
until then, the decision is looked at again when the deadline falls (pure)."""

from __future__ import annotations

from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder, parse_iso
from phalanx.reconcile.rules.transitions import fail


def apply(b: PlanBuilder, seen: Observed) -> bool:
    start = parse_iso(b.status.get("startTime"))
    deadline = seen.spec.run_policy.active_deadline_seconds
    if not deadline or start is None:
        return False
    if b.now >= start + deadline:
        fail(b, seen.current, "DeadlineExceeded", f"ran longer than activeDeadlineSeconds={deadline}")
        return True
    b.recheck(start + deadline - b.now)
    return False
