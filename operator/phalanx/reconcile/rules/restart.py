"""Between attempts: the next attempt waits for the previous one's pods to stop, except those
left behind on a lost node (they may never go) (pure)."""

from __future__ import annotations

from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder


def apply(b: PlanBuilder, seen: Observed) -> bool:
    if not seen.waited_for:
        return False
    message = f"waiting for {len(seen.waited_for)} pod(s) of the previous attempt to stop"
    if seen.left_behind:
        message += f"; not for {', '.join(sorted(seen.left_behind))} on lost node(s)"
    b.phase("Restarting", restart_reason(b), message)
    return True


def restart_reason(b: PlanBuilder) -> str:
    """The reason the restart began with, kept while it waits."""
    for cond in b.status["conditions"]:
        if cond["type"] == "Restarting" and cond["status"] == "True":
            return str(cond["reason"])
    return "Restarting"
