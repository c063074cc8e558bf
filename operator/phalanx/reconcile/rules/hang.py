"""A running gang whose rank 0 reports no new step within the hang bound is restarted, reason Hang
(policy/hang.py). Hangs have their own counter and spend the failure budget with failures: a
gang that keeps hanging fails like one that keeps crashing (pure)."""

from __future__ import annotations

from phalanx.policy import hang
from phalanx.policy.hang import REASON_HANG
from phalanx.policy.pod_outcome import VerdictKind
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder
from phalanx.reconcile.rules.transitions import fail, failure_budget_spent, restart


def apply(b: PlanBuilder, seen: Observed) -> bool:
    if b.old.get("phase") != "Running" or seen.verdict.kind is not VerdictKind.RUNNING:
        return False
    spec_seconds = seen.spec.run_policy.hang_timeout_seconds
    found, recheck = hang.detect(
        seen.trainer_report, seen.attempt, b.now, spec_seconds, pods=len(seen.current)
    )
    if found is None:
        if recheck is not None:
            b.recheck(recheck)
        return False
    restarts = b.status["restarts"]
    limit = seen.spec.run_policy.backoff_limit
    if failure_budget_spent(restarts) >= limit:
        fail(b, seen.current, "BackoffLimitExceeded", f"{found.message()}; backoffLimit={limit} reached")
        return True
    restarts["hangs"] = int(restarts.get("hangs", 0)) + 1
    restart(b, seen.current, REASON_HANG, found.message())
    return True
