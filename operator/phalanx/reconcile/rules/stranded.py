"""A gang admitted onto a node the scheduler will no longer bind to (builtin provider; pure).

Admission pins each pod to its node (builders/pods.admitted_pod) and the scheduler binds it moments
later, or, for a gang started early (gang/early_start.py), once the work there ends. If that node is
lost in between (not Ready for node_lost_after seconds), gone, being removed (an autoscaler's or
Karpenter's taint) or tainted NoExecute in a way the pod does not tolerate, the pod waits there for
good and the rest of the gang holds its room for nothing until the gang timeout (300 s by default). The attempt is torn down and queued again at once: no backoff and no restart
counted, since the node failed, not the gang; admission places the next attempt on nodes that take
pods. Restarting in place, only the stranded replacement goes (the kept ranks run on): it is created
again and placed anew.
"""

from __future__ import annotations

from typing import Any, Final

from phalanx.gang.capacity import (
    BLOCKING_EFFECTS,
    CONDITION_TAINT_PREFIX,
    Taint,
    Toleration,
    blocking_taint,
    tolerated_for,
)
from phalanx.pod_facts import is_deleting, is_terminal, kept_pod_uids, planned_node
from phalanx.policy.in_place import in_place_attempt_unfinished
from phalanx.policy.node_drain import REMOVAL_TAINTS
from phalanx.policy.node_loss import not_ready_since, seconds_until_lost
from phalanx.providers import provider_for
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import Event, PlanBuilder, iso
from phalanx.reconcile.rules.transitions import new_attempt

REASON_ADMITTED_NODE_UNUSABLE: Final = "AdmittedNodeUnusable"


def _refusal(node: dict[str, Any], pod: dict[str, Any]) -> str | None:
    """Why this Ready node will not take the pod for good: a taint it does not tolerate that says the
    node is going (an autoscaler's or Karpenter's removal), or a NoExecute taint it does not tolerate
    for good (evicted the moment it bound, or once its tolerationSeconds pass; admission does not
    place a gang there either: capacity.blocking_taint); None otherwise. A cordon, another NoSchedule taint or a label that no
    longer matches may pass (a short maintenance cordon, a network agent restarting, a scale-down
    aborted): tearing down would restart a gang for nothing, so those stay with the gang timeout."""
    tolerations = [Toleration.from_k8s(t) for t in (pod.get("spec") or {}).get("tolerations") or ()]
    for taint in (Taint.from_k8s(raw) for raw in (node.get("spec") or {}).get("taints") or ()):
        removal = REMOVAL_TAINTS.get(taint.key)
        if taint.effect not in BLOCKING_EFFECTS or taint.key.startswith(CONDITION_TAINT_PREFIX):
            continue  # a preference, or a condition taint (memory pressure and the like) that passes
        if removal is None and taint.effect != "NoExecute":
            continue
        if removal is not None and tolerated_for(taint, tolerations) is None:
            return f"being removed ({removal})"
        why = blocking_taint(taint, tolerations)
        if why is not None:  # NoExecute: untolerated, or tolerated for a while only
            return why
    return None


def why_unusable(pod: dict[str, Any], seen: Observed, now: float) -> tuple[str, str] | float | None:
    """(node, why) when the node the pod was admitted onto will not take it; else the seconds until
    that node counts as lost (not Ready, not lost yet), or None."""
    node_name = planned_node(pod)
    if node_name is None or is_terminal(pod) or is_deleting(pod):
        return None  # bound (node_loss.py's), not admitted, or on its way out
    node = seen.nodes.get(node_name)
    if node is None:
        return (node_name, "no longer exists") if seen.nodes else None  # no nodes: not known yet
    left = seconds_until_lost(node, now, seen.node_lost_after)
    if left is not None:
        if left > 0:
            return left
        since = not_ready_since(node)
        return node_name, f"not Ready since {iso(since) if since is not None else 'a while'}"
    refusal = _refusal(node, pod)
    return None if refusal is None else (node_name, refusal)


def apply(b: PlanBuilder, seen: Observed) -> bool:
    if not provider_for(seen.spec).admits_gangs or seen.kueue is not None:
        return False  # another scheduler's placement, or Kueue's admission: theirs to undo
    if in_place_attempt_unfinished(b.status):
        return _replace_stranded(b, seen)
    for pod in seen.current.values():
        found = why_unusable(pod, seen, b.now)
        if isinstance(found, float):
            b.recheck(found)  # decide again the moment the node counts as lost
        elif found is not None:
            node, why = found
            new_attempt(b, seen.current)
            message = (
                f"{pod['metadata']['name']} was admitted onto node {node}, which is {why}: it would not run "
                f"there; gang torn down and queued again as attempt {b.status['attempt']}"
            )
            if b.old.get("phase") == "Pending":  # no phase change, so phase() tells no one
                b.plan.events.append(Event("Warning", REASON_ADMITTED_NODE_UNUSABLE, message))
            b.phase("Pending", REASON_ADMITTED_NODE_UNUSABLE, message, "Warning")
            return True
    return False


def _replace_stranded(b: PlanBuilder, seen: Observed) -> bool:
    """Restarting in place, the pods admitted are the replacements; the kept pods run (bound). A
    stranded replacement alone is deleted and created again (rules/creation.py), to be admitted onto
    a node that takes pods: a full restart would throw the kept ranks away. status.inPlace names it
    (replacedPods), so it is no longer the attempt's pod and its rank reads as not created yet, not
    as lost. Deleted only if unchanged since this decision: bound meanwhile (its node back), the
    delete is refused and the pod is the attempt's again (pod_facts.in_current_attempt)."""
    stranded: list[tuple[dict[str, Any], str, str]] = []
    for pod in seen.current.values():
        found = why_unusable(pod, seen, b.now)
        if isinstance(found, float):
            b.recheck(found)
        elif found is not None:
            stranded.append((pod, *found))
    if not stranded:
        return False
    in_place = dict(b.status["inPlace"])
    # Earlier ones whose pod is gone are done with: the list stays as short as the pods it names.
    present = {str(p["metadata"].get("uid")) for p in seen.pods}
    in_place["replacedPods"] = [
        *(r for r in in_place.get("replacedPods") or [] if str(r.get("uid")) in present),
        *({"name": str(p["metadata"]["name"]), "uid": str(p["metadata"].get("uid"))} for p, _, _ in stranded),
    ]
    b.status["inPlace"] = in_place
    b.status.pop("createdAttempt", None)  # its ranks are to be created again
    b.status.pop("admittedTime", None)  # and admitted again: the gang timeout counts from then
    kept = ", ".join(sorted(kept_pod_uids(b.status))) or "none"
    for pod, node, why in stranded:
        name = str(pod["metadata"]["name"])
        b.plan.delete_unchanged_pods.append(name)
        b.plan.events.append(Event("Warning", REASON_ADMITTED_NODE_UNUSABLE, (
            f"{name}, replacing a rank in place, was admitted onto node {node}, which is {why}: deleted, "
            f"to be created again on a node that takes pods; the kept pods ({kept}) wait for it"
        )))  # fmt: skip
    return True
