"""Admission as the job sees it: one pod still at the gang gate and the gang waits, with the
admission pass's message; none, and it is admitted (pure)."""

from __future__ import annotations

from typing import Any

from phalanx.pod_facts import is_gated
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder, parse_iso


def apply(b: PlanBuilder, seen: Observed) -> bool:
    status = b.status
    # One pod still gated: the gang is not admitted (the trainer needs every rank). A pass stopped
    # half-way through lifting the gates is finished by the next one.
    if any(is_gated(p) for p in seen.current.values()):
        message = status.get("admissionMessage") or "waiting for the whole gang to fit"
        b.condition("Admitted", "False", "WaitingForCapacity", message)
        b.phase("Pending", "WaitingForCapacity", message)
        return True
    if not status.get("admittedTime"):
        status["admittedTime"] = b.now_iso
        if seen.kueue is None:  # Kueue's record is its rule's (rules/kueue.py)
            status["admission"] = {"by": "Builtin", "waitedSeconds": int(gang_waited(seen, b.now))}
    status.pop("admissionMessage", None)
    b.condition("Admitted", "True", "GangAdmitted", f"all {seen.spec.replicas} pod(s) admitted together")
    return False


def gang_waited(seen: Observed, now: float) -> float:
    """Seconds since the gang asked for admission: its oldest pod's creation (the job's, unknown)."""
    created = [parse_iso(p["metadata"].get("creationTimestamp")) for p in seen.current.values()]
    asked = min((t for t in created if t is not None), default=seen.created)
    return max(0.0, now - asked) if asked is not None else 0.0


def starting(b: PlanBuilder, seen: Observed) -> bool:
    """Admitted, not all running yet: say how many run and, if the scheduler says why not, that."""
    if b.status.get("phase") != "Restarting" or seen.running:
        message = f"{seen.running}/{seen.spec.replicas} worker(s) running"
        why = unschedulable_message(seen.current.values())
        if why:
            message += f"; the scheduler says: {why}"
        b.phase("Admitted", "GangAdmitted", message)
    return True


def unschedulable_message(pods: Any) -> str:
    for pod in pods:
        for cond in pod.get("status", {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("message"):
                return str(cond["message"])[:300]
    return ""
