"""A worker failed: a permanent failure fails the job at once; a retryable one restarts the gang
until spec.runPolicy.backoffLimit restarts for failures are spent (pure)."""

from __future__ import annotations

from phalanx.policy.pod_outcome import VerdictKind
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder
from phalanx.reconcile.rules.transitions import fail, restart


def apply(b: PlanBuilder, seen: Observed) -> bool:
    verdict, status = seen.verdict, b.status
    if verdict.kind is VerdictKind.FAILED:
        fail(b, seen.current, verdict.reason, verdict.message)
        return True
    if verdict.kind is not VerdictKind.RESTART_FAILURE:
        return False
    failures = status["restarts"].get("failures", 0)
    limit = seen.spec.run_policy.backoff_limit
    if failures + status["restarts"].get("hangs", 0) >= limit:  # hangs spend the same budget
        fail(b, seen.current, "BackoffLimitExceeded", f"{verdict.message}; backoffLimit={limit} reached")
        return True
    status["restarts"]["failures"] = failures + 1
    restart(b, seen.current, "FailureRestart", verdict.message)
    return True
