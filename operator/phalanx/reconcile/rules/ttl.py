"""A finished job: a failed one's pods that still run are stopped; the job is deleted once
spec.runPolicy.ttlSecondsAfterFinished has passed since completionTime (pure)."""

from __future__ import annotations

from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import FINISHED_PHASES, PlanBuilder, parse_iso
from phalanx.reconcile.rules.transitions import delete_unfinished


def apply(b: PlanBuilder, seen: Observed) -> bool:
    if b.status.get("phase") not in FINISHED_PHASES:
        return False
    if b.status.get("phase") == "Failed":
        delete_unfinished(b, seen.current)
    ttl = seen.spec.run_policy.ttl_seconds_after_finished
    done = parse_iso(b.status.get("completionTime"))
    if ttl is not None and done is not None:
        if b.now >= done + ttl:
            b.plan.delete_job = True
        else:
            b.recheck(done + ttl - b.now)
    return True
