"""A job in a Kueue queue runs only while Kueue admits its Workload (pure; docs/kueue.md).

Waiting: no pod exists; the status says why in Kueue's words. Admitted: the decision goes on to the
other rules (the gang is created with the flavors' placement, ungated). Evicted, or its admission
withdrawn, while the attempt has pods: they are deleted with their grace period (SIGTERM: the
trainer writes its emergency checkpoint and exits with the preemption code), and the next attempt
waits for Kueue to admit the Workload again; it resumes from that checkpoint. The restart is never a
failure: a preemption (Kueue's reason Preempted, or NodeFailures) counts in restarts.preemptions, any
other eviction (PodsReadyTimeout, AdmissionCheck, a stopped queue, a deactivation) in
restarts.requeues, with Kueue's reason in the status and the Event. A gang that succeeded, or failed
for good, before the eviction was acted on ends so (the success or failure rule decides it).
"""

from __future__ import annotations

from typing import Any

from phalanx.kueue.gate import counts_as_preemption
from phalanx.pod_facts import is_deleting
from phalanx.policy.pod_outcome import VerdictKind
from phalanx.reconcile.conditions import get_condition
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import Event, PlanBuilder
from phalanx.reconcile.rules.transitions import fail, new_attempt

REASON_WAITING_FOR_KUEUE = "WaitingForKueue"
REASON_WORKLOAD_REFUSED = "WorkloadRefused"  # the API server (Kueue's webhook) refused the Workload
REASON_EVICTED_BY_KUEUE = "EvictedByKueue"  # preempted (or its node failed): restarts.preemptions
REASON_REQUEUED_BY_KUEUE = "RequeuedByKueue"  # any other eviction: restarts.requeues
REASON_FAILED_TO_START = "FailedToStart"  # admitted, but its flavors cannot be placed (Kueue's word)
# How often a waiting or running job looks at its Workload again: the fallback to the Workload watch
# (controller/kueue_workloads.py), should it be lost.
RECHECK_WAITING_SECONDS = 2.0
RECHECK_ADMITTED_SECONDS = 5.0


def apply(b: PlanBuilder, seen: Observed) -> bool:
    gate = seen.kueue
    if gate is None:
        return False
    status = b.status
    started = status.get("createdAttempt") == seen.attempt or any(
        not is_deleting(p) for p in seen.current.values()
    )
    if gate.refused:
        # Said in status, and in an Event whenever the API's words change; a running gang goes on as
        # Kueue last said (the gate read before the refusal), stopped only if that was an eviction.
        said = get_condition(b.old.get("conditions") or [], "Admitted") or {}
        if b.old.get("phase") == "Pending" and (said.get("reason"), said.get("message")) != (
            REASON_WORKLOAD_REFUSED,
            gate.refusal,
        ):
            b.plan.events.append(Event("Warning", REASON_WORKLOAD_REFUSED, gate.refusal))
        b.recheck(gate.retry_after or RECHECK_WAITING_SECONDS)
        b.condition("Admitted", "False", REASON_WORKLOAD_REFUSED, gate.refusal)
        if started and not gate.evicted:
            return False
        if not started:
            status.pop("admission", None)
            b.phase("Pending", REASON_WORKLOAD_REFUSED, gate.refusal, "Warning")
            return True
    if gate.admitted and not gate.evicted and gate.stale and not started:
        # Admitted for the job as it was: its pods would run against quota for another gang.
        message = (
            f"waiting for Kueue: Workload {gate.workload} was admitted for the job as it was ({gate.stale}); "
            "no pod starts against it: it is recreated and queued again as the job is now"
        )
        status.pop("admission", None)
        b.recheck(RECHECK_WAITING_SECONDS)
        b.condition("Admitted", "False", REASON_WAITING_FOR_KUEUE, message)
        b.phase("Pending", REASON_WAITING_FOR_KUEUE, message)
        return True
    if gate.admitted and not gate.evicted and gate.placement_failed and not started:
        # Never placeable as admitted: failed, so that Finished hands the quota back (as Kueue's own
        # integrations do); a Workload deactivated instead would leave the job Pending for good.
        fail(
            b,
            seen.current,
            REASON_FAILED_TO_START,
            f"Kueue's admission cannot be placed: {gate.placement_error}",
        )
        return True
    if gate.admitted and not gate.evicted and gate.placement_error and not started:
        # Admitted, but the pods cannot be placed as Kueue assigned: none starts off its flavor's nodes.
        message = f"waiting for Kueue: {gate.placement_error}"
        status.pop("admission", None)
        b.recheck(gate.retry_after or RECHECK_WAITING_SECONDS)
        b.condition("Admitted", "False", REASON_WAITING_FOR_KUEUE, message)
        b.phase("Pending", REASON_WAITING_FOR_KUEUE, message)
        return True
    if gate.admitted and not gate.evicted:
        record: dict[str, Any] = {"by": "Kueue", "workload": gate.workload}
        if gate.cluster_queue:
            record["clusterQueue"] = gate.cluster_queue
        if gate.waited_seconds is not None:
            record["waitedSeconds"] = int(gate.waited_seconds)
        status["admission"] = record
        b.recheck(RECHECK_ADMITTED_SECONDS)  # an eviction is seen within this
        return False
    if started and seen.verdict.kind in (VerdictKind.SUCCEEDED, VerdictKind.FAILED):
        # Done before the eviction was acted on (Kueue too looks at Finished before Evicted): the
        # success or failure rule decides, and Finished hands the quota back.
        return False
    status.pop("admission", None)
    b.recheck(RECHECK_WAITING_SECONDS)
    if started:
        preempted = counts_as_preemption(gate.eviction_reason)
        counter, reason = (
            ("preemptions", REASON_EVICTED_BY_KUEUE) if preempted else ("requeues", REASON_REQUEUED_BY_KUEUE)
        )
        restarts = status["restarts"]
        restarts[counter] = restarts.get(counter, 0) + 1
        new_attempt(b, seen.current)
        message = (
            f"{gate.message}; stopping the gang (SIGTERM: the trainer checkpoints), then waiting for "
            f"Kueue to admit attempt {status['attempt']}, which resumes from the newest checkpoint"
        )
        b.condition("Admitted", "False", reason, message)
        if preempted:
            b.condition("Preempted", "True", reason, message)
        b.phase("Pending", reason, message, "Warning")
        return True
    b.condition("Admitted", "False", REASON_WAITING_FOR_KUEUE, gate.message)
    b.phase("Pending", REASON_WAITING_FOR_KUEUE, gate.message)
    return True
