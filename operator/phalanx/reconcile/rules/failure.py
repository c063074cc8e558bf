"""A worker failed: a permanent failure fails the job at once; a retryable one restarts the gang
until spec.runPolicy.backoffLimit restarts for failures are spent (pure)."""

from __future__ import annotations

from phalanx.policy.pod_outcome import VerdictKind
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder
from phalanx.reconcile.rules.transitions import fail, failure_budget_spent, restart


def apply(b: PlanBuilder, seen: Observed) -> bool:
    verdict, status = seen.verdict, b.status
    if verdict.kind is VerdictKind.FAILED:
        fail(b, seen.current, verdict.reason, verdict.message)
        return True
    if verdict.kind is not VerdictKind.RESTART_FAILURE:
        return False
    limit = seen.spec.run_policy.backoff_limit
    if failure_budget_spent(status["restarts"]) >= limit:
        fail(b, seen.current, "BackoffLimitExceeded", f"{verdict.message}; backoffLimit={limit} reached")
        return True
    status["restarts"]["failures"] = status["restarts"].get("failures", 0) + 1
    restart(b, seen.current, "FailureRestart", verdict.message)
    return True
