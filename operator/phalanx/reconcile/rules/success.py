"""Every worker exited 0: the job succeeded, and its progress reads 100% (pure)."""

from __future__ import annotations

from typing import Any

from phalanx.policy.pod_outcome import VerdictKind
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import PlanBuilder


def apply(b: PlanBuilder, seen: Observed) -> bool:
    if seen.verdict.kind is not VerdictKind.SUCCEEDED:
        return False
    b.status["completionTime"] = b.now_iso
    b.status.pop("elasticCap", None)  # nothing left to size; a finished job carries no cap
    b.phase("Succeeded", seen.verdict.reason, "every worker exited 0")
    return True


def progress_done(b: PlanBuilder, seen: Observed) -> bool:
    """After every decision (the phase may have been Succeeded already)."""
    complete_progress(b.status)
    return False


def complete_progress(status: dict[str, Any]) -> None:
    """A succeeded job shows its last step as done, whatever the trainer's last report said (the
    last poll comes a moment before the end)."""
    if status.get("phase") == "Succeeded" and status.get("progress", {}).get("totalSteps"):
        done = dict(status["progress"])
        status["progress"] = {**done, "step": done["totalSteps"], "percent": 100, "etaSeconds": 0}
