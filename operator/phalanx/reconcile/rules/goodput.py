"""After every decision: the time since the last pass is booked into status.goodput, productive or
lost and to what (policy/goodput.py). Runs after rules/recovery.py: a recovery that just completed
ends the time lost to it (pure)."""

from __future__ import annotations

from typing import Any

from phalanx.gang.devices import gang_devices, pod_devices
from phalanx.pod_facts import is_terminal
from phalanx.policy import goodput, recovery_timeline
from phalanx.policy.spares import idle_spares
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder


def apply(b: PlanBuilder, seen: Observed) -> bool:
    unit, count = gang_devices(seen.spec, seen.pod_template)
    facts = None
    report = seen.trainer_report
    if report is not None:
        first_step = recovery_timeline.parse_time((report.get("startup") or {}).get("first_step"))
        facts = goodput.TrainerFacts(
            attempt=int(report.get("attempt") or 0),
            first_step_at=first_step,
            seconds_per_step=_number(report.get("seconds_per_step")),
            checkpoint_stall_seconds=_number(report.get("checkpoint_stall_seconds")),
        )
    created = seen.created if seen.created is not None else b.now
    # Spares standing by on nodes, as this pass sees them (a spare taking a rank is a worker now).
    standing_by = sum(
        1
        for p in idle_spares(seen.pods, b.status)
        if (p.get("spec") or {}).get("nodeName") and not is_terminal(p)
    )
    devices = goodput.Devices(unit, count, standing_by * pod_devices(seen.spec, seen.pod_template)[1])
    ledger = goodput.account(b.old, b.status, created, b.now, devices, facts, seen.status_write_due)
    if ledger is not None:
        b.status["goodput"] = ledger
    return False


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
