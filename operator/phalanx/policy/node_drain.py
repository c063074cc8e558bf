"""Whether a node is being emptied (pure): tainted for removal by an autoscaler, or cordoned.

`kubectl drain` cordons a node and then evicts its pods (one request per pod, sent concurrently
behind the client's rate limit); the cluster autoscaler and Karpenter taint the node first, then
evict. When one rank's pod is evicted from such a node, the gang's other pods there are next. A
restart in place that kept them would meet their eviction before its first step (two failures in
one generation: a full restart, policy/in_place.py), so it replaces them in the same recovery.

A removal taint says the node is going. A bare cordon says only "no new pods" (an operator may
cordon a suspect node and let its jobs finish): it counts only together with an eviction from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

# Taint keys that announce the node's removal (NoSchedule while its pods are evicted). Not
# DeletionCandidateOfClusterAutoscaler: a PreferNoSchedule candidate may well stay.
CLUSTER_AUTOSCALER_DELETION_TAINT: Final = "ToBeDeletedByClusterAutoscaler"
KARPENTER_DISRUPTED_TAINT: Final = "karpenter.sh/disrupted"  # Karpenter v1
KARPENTER_LEGACY_DISRUPTION_TAINT: Final = "karpenter.sh/disruption"  # before v1 (value "disrupting")
REMOVAL_TAINTS: Final = {
    CLUSTER_AUTOSCALER_DELETION_TAINT: "the cluster autoscaler is removing it",
    KARPENTER_DISRUPTED_TAINT: "Karpenter is removing it",
    KARPENTER_LEGACY_DISRUPTION_TAINT: "Karpenter is removing it",
}


def being_removed(node: Mapping[str, Any] | None) -> str | None:
    """Why the node is going (a removal taint), or None (also for a node not known)."""
    for taint in ((node or {}).get("spec") or {}).get("taints") or ():
        why = REMOVAL_TAINTS.get(str(taint.get("key")))
        if why is not None:
            return why
    return None


def is_cordoned(node: Mapping[str, Any] | None) -> bool:
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))
