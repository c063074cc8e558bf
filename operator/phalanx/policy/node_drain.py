"""Whether a node is being emptied (pure): cordoned, or marked for removal by an autoscaler.

A drain evicts every pod of a node: `kubectl drain` cordons the node and then evicts its pods (one
request each, behind the client's rate limit: with several pods they arrive some 100-200 ms apart);
the cluster autoscaler and Karpenter taint the node first, then evict. When one rank's pod is
evicted from such a node, the gang's other pods there are next. A restart in place that kept them
would meet their eviction before its first step (two failures in one generation: a full restart,
policy/in_place.py), so it replaces them with the evicted one instead, in one recovery.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

# Taint keys that announce the node's removal (NoSchedule while its pods are evicted).
CLUSTER_AUTOSCALER_DELETION_TAINT: Final = "ToBeDeletedByClusterAutoscaler"
KARPENTER_DISRUPTED_TAINT: Final = "karpenter.sh/disrupted"  # Karpenter v1
KARPENTER_LEGACY_DISRUPTION_TAINT: Final = "karpenter.sh/disruption"  # before v1 (value "disrupting")
REMOVAL_TAINTS: Final = {
    CLUSTER_AUTOSCALER_DELETION_TAINT: "the cluster autoscaler is removing it",
    KARPENTER_DISRUPTED_TAINT: "Karpenter is removing it",
    KARPENTER_LEGACY_DISRUPTION_TAINT: "Karpenter is removing it",
}


def being_emptied(node: Mapping[str, Any] | None) -> str | None:
    """Why the node's pods are about to be evicted (cordoned, or tainted for removal); None when
    nothing says so (or the node is not known)."""
    if node is None:
        return None
    spec = node.get("spec") or {}
    for taint in spec.get("taints") or ():
        why = REMOVAL_TAINTS.get(str(taint.get("key")))
        if why is not None:
            return why
    if spec.get("unschedulable"):
        return "it is cordoned"
    return None
