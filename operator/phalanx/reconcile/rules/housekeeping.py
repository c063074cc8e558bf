"""Every decision, first: older attempts' pods go, pods on vanished nodes go at once, and the
replica counters are brought up to date (pure)."""

from __future__ import annotations

from phalanx.pod_facts import is_deleting, is_ready, is_terminal
from phalanx.reconcile.observed import Observed, on_vanished_node
from phalanx.reconcile.plan import PlanBuilder


def apply(b: PlanBuilder, seen: Observed) -> bool:
    b.plan.delete_pods.extend(p["metadata"]["name"] for p in seen.stale if not is_deleting(p))
    # A pod bound to a Node object that no longer exists has no kubelet to stop it: remove it at once
    # (what pod garbage collection does ~40 s later) so the next attempt need not wait.
    b.plan.force_delete_pods.extend(
        p["metadata"]["name"] for p in seen.pods if on_vanished_node(p, seen.nodes)
    )
    pods = list(seen.current.values())
    ready = sum(is_ready(p) for p in pods)
    b.status["replicas"] = {
        "active": sum(not is_terminal(p) for p in pods),
        "ready": ready,
        "succeeded": sum(p.get("status", {}).get("phase") == "Succeeded" for p in pods),
        "failed": sum(p.get("status", {}).get("phase") == "Failed" for p in pods),
    }
    b.status["readySummary"] = f"{ready}/{seen.spec.replicas}"
    return False
