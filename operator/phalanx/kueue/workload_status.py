"""What the owner of a Workload writes into its status, as Kueue's job integrations do (pure; Kueue
v0.17 pkg/controller/jobframework/reconciler.go is the reference for each step):

- PodsReady: True once every pod of the gang runs and is ready (waitForPodsReady reads it; without
  it Kueue would evict the gang after its timeout), False WaitForStart until then.
  Not admitted (evicted, queued again), it is False WaitForStart.
- Finished: True when the job succeeded or failed; Kueue then releases the quota.
- After an eviction (Evicted=True), once the gang's pods are gone: the quota reservation is cleared
  (admission removed, QuotaReserved=False Pending, Admitted=False NoReservation) and Requeued set,
  True for a preemption or node failures; Kueue then queues the workload again.

Each function returns the new status conditions and fields to merge-patch, or None when there is
nothing to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from phalanx.pod_facts import is_terminal
from phalanx.policy.node_loss import lost_node_names, on_lost_node
from phalanx.reconcile.conditions import get_condition, set_condition

# Kueue requeues (Requeued=True) only after these eviction reasons; others (deactivation, say) not.
_REQUEUED_AFTER: Final = ("Preempted", "NodeFailures")
_NOT_READY: Final = "Not all pods are ready or succeeded"
_READY: Final = "All pods reached readiness and the workload is running"


def _conditions(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return list((workload.get("status") or {}).get("conditions") or [])


def _generation(workload: dict[str, Any]) -> int | None:
    generation = (workload.get("metadata") or {}).get("generation")
    return int(generation) if generation is not None else None


def _changed(workload: dict[str, Any], conditions: list[dict[str, Any]]) -> bool:
    def key(c: dict[str, Any]) -> tuple[str, str, str, str]:
        return (str(c.get("type")), str(c.get("status")), str(c.get("reason")), str(c.get("message")))

    return sorted(map(key, _conditions(workload))) != sorted(map(key, conditions))


def pods_ready(workload: dict[str, Any], ready: bool, now_iso: str) -> dict[str, Any] | None:
    """PodsReady as Kueue's generatePodsReadyCondition sets it for an admitted workload."""
    previous = get_condition(_conditions(workload), "PodsReady")
    if ready:
        recovering = previous is not None and previous.get("reason") in ("WaitForRecovery", "Recovered")
        status, reason, message = "True", "Recovered" if recovering else "Started", _READY
    elif previous is not None and (
        previous.get("status") == "True" or previous.get("reason") == "WaitForRecovery"
    ):
        status, reason, message = (
            "False",
            "WaitForRecovery",
            "At least one pod has failed, waiting for recovery",
        )
    else:
        status, reason, message = "False", "WaitForStart", _NOT_READY
    conditions = set_condition(_conditions(workload), "PodsReady", status, reason, message, now_iso,
                               _generation(workload))  # fmt: skip
    return {"conditions": conditions} if _changed(workload, conditions) else None


def _waiting_for_start(
    workload: dict[str, Any], conditions: list[dict[str, Any]], now_iso: str
) -> list[dict[str, Any]]:
    return set_condition(
        conditions, "PodsReady", "False", "WaitForStart", _NOT_READY, now_iso, _generation(workload)
    )


def waiting_for_start(workload: dict[str, Any], now_iso: str) -> dict[str, Any] | None:
    """Not admitted (evicted, or queued again): PodsReady=False WaitForStart, as Kueue sets it for a
    stopped job, so that the next admission's gang is starting, not recovering."""
    conditions = _waiting_for_start(workload, _conditions(workload), now_iso)
    return {"conditions": conditions} if _changed(workload, conditions) else None


def finished(workload: dict[str, Any], succeeded: bool, message: str, now_iso: str) -> dict[str, Any] | None:
    if get_condition(_conditions(workload), "Finished") is not None:
        return None  # finished once: Kueue has released the quota
    reason = "Succeeded" if succeeded else "Failed"
    conditions = set_condition(_conditions(workload), "Finished", "True", reason, message or reason, now_iso,
                               _generation(workload))  # fmt: skip
    return {"conditions": conditions}


def released_after_eviction(workload: dict[str, Any], now_iso: str) -> dict[str, Any] | None:
    """Evicted and the gang stopped: the quota reservation cleared, so that Kueue queues it again."""
    status = workload.get("status") or {}
    evicted = get_condition(_conditions(workload), "Evicted")
    if evicted is None or evicted.get("status") != "True" or not status.get("admission"):
        return None
    reason, message = str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or "evicted")
    generation = _generation(workload)
    conditions = _conditions(workload)
    conditions = set_condition(conditions, "Requeued", "True" if reason in _REQUEUED_AFTER else "False", reason,
                               message, now_iso, generation)  # fmt: skip
    conditions = set_condition(conditions, "QuotaReserved", "False", "Pending", message, now_iso, generation)
    conditions = set_condition(conditions, "Admitted", "False", "NoReservation", "The workload has no reservation",
                               now_iso, generation)  # fmt: skip
    conditions = _waiting_for_start(workload, conditions, now_iso)
    return {"conditions": conditions, "admission": None}


def gang_stopped(
    pods: list[dict[str, Any]], nodes: Mapping[str, Mapping[str, Any]], now: float, node_lost_after: float
) -> bool:
    """Every pod ended, or left on a lost node: those say Running while Terminating for as long as the
    node is gone, and the restart does not wait for them either (policy/node_loss.py)."""
    lost = lost_node_names(nodes, now, node_lost_after)
    return all(is_terminal(p) or on_lost_node(p, nodes, lost) for p in pods)
