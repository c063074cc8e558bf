"""A worker was preempted (evicted, its node lost, deleted by someone else, or it checkpointed on
SIGTERM): the gang restarts without spending the failure budget (pure)."""

from __future__ import annotations

from phalanx.policy.pod_outcome import VerdictKind
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder
from phalanx.reconcile.rules.transitions import restart


def apply(b: PlanBuilder, seen: Observed) -> bool:
    if seen.verdict.kind is not VerdictKind.RESTART_PREEMPTION:
        return False
    restarts = b.status["restarts"]
    restarts["preemptions"] = restarts.get("preemptions", 0) + 1
    restart(b, seen.current, "Preempted", seen.verdict.message)
    return True
