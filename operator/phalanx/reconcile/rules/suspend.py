"""spec.runPolicy.suspend: the attempt's pods are deleted, the status is kept (pure)."""

from __future__ import annotations

from phalanx.pod_facts import is_deleting
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder


def apply(b: PlanBuilder, seen: Observed) -> bool:
    if not seen.spec.run_policy.suspend:
        return False
    b.plan.delete_pods.extend(p["metadata"]["name"] for p in seen.current.values() if not is_deleting(p))
    b.phase("Suspended", "Suspended", "spec.runPolicy.suspend is true: pods deleted, status kept")
    return True
