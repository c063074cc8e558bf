"""Every replica runs: the job is Running; startTime is set once (the deadline counts from it),
and a Preempted condition is cleared on the way back to Running (pure)."""

from __future__ import annotations

from phalanx.reconcile.conditions import get_condition
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder


def apply(b: PlanBuilder, seen: Observed) -> bool:
    replicas = seen.spec.replicas
    if seen.running < replicas:
        return False
    b.status.setdefault("startTime", b.now_iso)
    # Only on the way back to Running: the victim is still Running between the condition and the
    # eviction of its pods.
    preempted = get_condition(b.status["conditions"], "Preempted")
    if b.old.get("phase") != "Running" and preempted is not None and preempted.get("status") == "True":
        b.condition("Preempted", "False", "Running", f"running again as attempt {seen.attempt}")
    b.phase("Running", "AllWorkersRunning", f"{replicas} worker(s) running, attempt {seen.attempt}")
    return True
