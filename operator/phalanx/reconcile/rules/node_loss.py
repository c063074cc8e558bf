"""A pod on a node that is not Ready, yet not lost: decide again the moment the node counts as
lost (policy/node_loss.py) (pure)."""

from __future__ import annotations

from phalanx.pod_facts import is_terminal
from phalanx.policy.node_loss import seconds_until_lost
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder


def apply(b: PlanBuilder, seen: Observed) -> bool:
    for pod in seen.current.values():
        node = seen.nodes.get(pod.get("spec", {}).get("nodeName") or "")
        if node is None or is_terminal(pod):
            continue
        left = seconds_until_lost(node, b.now, seen.node_lost_after)
        if left is not None and left > 0:
            b.recheck(left)
    return False
