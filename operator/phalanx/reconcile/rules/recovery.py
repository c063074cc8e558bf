"""After every decision: status.lastRecovery gets what this pass and the trainer's latest report
add to the last recovery's timeline (policy/recovery_timeline.py), and a Recovered event once it is
complete (pure)."""

from __future__ import annotations

from phalanx.policy import recovery_timeline
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import Event, PlanBuilder


def apply(b: PlanBuilder, seen: Observed) -> bool:
    recovery = recovery_timeline.after_reconcile(b.old, b.status, b.now)
    if recovery is not None:
        b.status["lastRecovery"] = recovery
    if seen.trainer_report is not None:
        recovery = recovery_timeline.after_trainer_report(b.status.get("lastRecovery"), seen.trainer_report)
        if recovery is not None:
            b.status["lastRecovery"] = recovery
    done = b.status.get("lastRecovery")
    if recovery_timeline.is_complete(done) and not recovery_timeline.is_complete(b.old.get("lastRecovery")):
        b.plan.events.append(Event("Normal", "Recovered", str(done["summary"])))
    return False
