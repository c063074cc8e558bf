"""What Kueue says about a job, read from its Workload (pure): may the gang run, on which flavors,
and if not, why, in Kueue's words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from phalanx import constants as c
from phalanx.kueue.placement import FlavorPlacement
from phalanx.reconcile.conditions import get_condition
from phalanx.reconcile.plan import parse_iso


@dataclass(frozen=True)
class KueueGate:
    workload: str
    admitted: bool  # quota reserved and every admission check passed: the gang may run
    evicted: bool  # Evicted=True: the gang must stop, then the quota goes back (workload_status.py)
    # Why it may not run, in Kueue's words (the Evicted or QuotaReserved=False message); "" when it may.
    message: str
    cluster_queue: str | None = None
    flavors: tuple[str, ...] = ()  # ResourceFlavors assigned to the workers pod set
    # Seconds from queued (created, or requeued after an eviction) to admitted; None while waiting.
    waited_seconds: float | None = None
    finished: bool = False
    # What the job changed since its Workload was admitted (kueue/workload.py stale_in): no pod starts
    # against that admission; the Workload is recreated once the gang is stopped. "": up to date.
    stale: str = ""
    # The Evicted condition's reason (Kueue's words: Preempted, PodsReadyTimeout, AdmissionCheck,
    # ClusterQueueStopped, LocalQueueStopped, NodeFailures, Deactivated, ...); "" when not evicted.
    eviction_reason: str = ""
    # The admission checks' podSetUpdates for the workers pod set, each with its check's name under
    # "admissionCheck" (kueue/placement.py merges them with the flavors').
    pod_set_updates: tuple[dict[str, Any], ...] = ()
    # Where the gang goes (controller/kueue_workloads.py resolves the flavors), and why it cannot
    # start when that failed: an assigned ResourceFlavor missing, or two values asked for one key.
    placement: FlavorPlacement = field(default_factory=FlavorPlacement)
    placement_error: str = ""
    # The placement cannot be made (a conflict, or a flavor missing past its bound): the job fails,
    # so that Finished hands the quota back (Kueue's own integrations: FailedToStart).
    placement_failed: bool = False
    # The API server (Kueue's validating webhook) refused to create or change the Workload; looked at
    # again after `retry_after` seconds (a growing backoff).
    refused: bool = False
    retry_after: float | None = None
    # The refusal, in the API's words; the rest of a refused gate is the last one read (a started
    # gang goes on as Kueue last said), or a waiting one when none was.
    refusal: str = ""


# Evictions that take the devices for someone else, or with a node: counted as preemptions. Any other
# (PodsReadyTimeout, a rejected admission check, a stopped queue, a deactivation) is a requeue.
PREEMPTION_REASONS: Final = ("Preempted", "NodeFailures")


# The eviction reason of a Workload someone deleted under its live job (not one of Kueue's own).
WORKLOAD_DELETED: Final = "WorkloadDeleted"


def counts_as_preemption(eviction_reason: str) -> bool:
    return eviction_reason in PREEMPTION_REASONS


def _true(workload: dict[str, Any], type_: str) -> dict[str, Any] | None:
    cond = get_condition((workload.get("status") or {}).get("conditions") or [], type_)
    return cond if cond is not None and cond.get("status") == "True" else None


def queued_since(workload: dict[str, Any]) -> float | None:
    """When the workload last joined the queue: its creation, or its latest requeue (as Kueue's own
    QueuedWaitTime reads it)."""
    requeued = get_condition((workload.get("status") or {}).get("conditions") or [], "Requeued")
    if requeued is not None and requeued.get("lastTransitionTime"):
        return parse_iso(requeued["lastTransitionTime"])
    return parse_iso((workload.get("metadata") or {}).get("creationTimestamp"))


def deactivated_message(workload: dict[str, Any]) -> str | None:
    """Why Kueue (or an admin) deactivated the Workload of a job the operator did not suspend; None
    when it is active, or inactive because the job is suspended."""
    meta = workload.get("metadata") or {}
    if (workload.get("spec") or {}).get("active", True) is not False:
        return None
    if (meta.get("annotations") or {}).get(c.KUEUE_SUSPENDED_ANNOTATION) == "true":
        return None
    conditions = (workload.get("status") or {}).get("conditions") or []
    why = get_condition(conditions, "DeactivationTarget") or get_condition(conditions, "Evicted") or {}
    reason, message = why.get("reason") or "Deactivated", why.get("message") or "spec.active is false"
    return (
        f"deactivated by Kueue ({reason}): {message}; it is queued again once spec.active of Workload "
        f"{meta.get('name', '')} is set to true"
    )


def gate_of(workload: dict[str, Any]) -> KueueGate:
    status = workload.get("status") or {}
    name = str((workload.get("metadata") or {}).get("name", ""))
    admission = status.get("admission") or {}
    conditions = status.get("conditions") or []
    evicted = _true(workload, "Evicted")
    admitted_cond = _true(workload, "Admitted")
    admitted = bool(admission) and admitted_cond is not None and _true(workload, "QuotaReserved") is not None
    finished = _true(workload, "Finished") is not None
    flavors: set[str] = set()
    for assignment in admission.get("podSetAssignments") or []:
        if assignment.get("name") == c.KUEUE_PODSET:
            flavors.update(str(f) for f in (assignment.get("flavors") or {}).values())
    updates = tuple(
        {**update, "admissionCheck": str(check.get("name") or "")}
        for check in status.get("admissionChecks") or []
        for update in check.get("podSetUpdates") or []
        if update.get("name") == c.KUEUE_PODSET
    )
    reserved = get_condition(conditions, "QuotaReserved")
    pending = ""  # Kueue's reason for not reserving quota, if it gave one
    if reserved is not None and reserved.get("status") == "False":
        pending = str(reserved.get("message") or "")
    if evicted is not None:
        message = f"evicted by Kueue ({evicted.get('reason', 'Evicted')}): {evicted.get('message', '')}"
        if pending and not admission:  # stopped and handed back: why it is not admitted again
            message = f"{message}; waiting for Kueue: {pending}"
    elif admitted:
        message = ""
    else:
        admitted_false = get_condition(conditions, "Admitted")
        if pending:
            message = f"waiting for Kueue: {pending}"
        elif reserved is not None and reserved.get("status") == "True" and admitted_false is not None:
            message = f"waiting for Kueue's admission checks: {admitted_false.get('message', '')}"
        else:
            message = f"waiting for Kueue to consider Workload {name}"
    waited = None
    if admitted and admitted_cond is not None:
        since, at = queued_since(workload), parse_iso(admitted_cond.get("lastTransitionTime"))
        if since is not None and at is not None:
            waited = max(0.0, at - since)
    deactivated = deactivated_message(workload)
    if deactivated is not None:
        admitted, message = False, deactivated
    eviction_reason = str(evicted.get("reason") or "Evicted") if evicted is not None else ""
    if (workload.get("metadata") or {}).get("deletionTimestamp"):
        # `kubectl delete workload` is Kueue's way to requeue: the gang stops, the finalizer comes
        # off once it has, and a fresh Workload queues the job again (controller/kueue_workloads.py).
        admitted, eviction_reason = False, WORKLOAD_DELETED
        message = f"evicted ({WORKLOAD_DELETED}): Workload {name} was deleted; it is made again once the gang stopped"
    return KueueGate(
        workload=name,
        admitted=admitted,
        evicted=evicted is not None or eviction_reason == WORKLOAD_DELETED,
        message=message,
        cluster_queue=admission.get("clusterQueue"),
        flavors=tuple(sorted(flavors)),
        waited_seconds=waited,
        finished=finished,
        eviction_reason=eviction_reason,
        pod_set_updates=updates,
    )
