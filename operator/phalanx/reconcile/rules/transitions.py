"""The moves several rules make: a new attempt, a restart, a failure (pure)."""

from __future__ import annotations

from typing import Any

from phalanx.pod_facts import is_deleting, is_terminal
from phalanx.reconcile.plan import PlanBuilder


def failure_budget_spent(restarts: dict[str, Any]) -> int:
    """Restarts that spend spec.runPolicy.backoffLimit: failures and hangs (a gang that keeps hanging
    fails like one that keeps crashing); preemptions never do."""
    return int(restarts.get("failures", 0) or 0) + int(restarts.get("hangs", 0) or 0)


def new_attempt(b: PlanBuilder, current: dict[int, dict[str, Any]]) -> None:
    """Moves to attempt+1; the pods of this attempt are deleted with their grace period (SIGTERM)."""
    b.status["attempt"] = int(b.status["attempt"]) + 1
    b.status.pop("admittedTime", None)
    b.status.pop("createdAttempt", None)
    b.status.pop("inPlace", None)  # a new attempt of its own pods keeps none (rules/in_place.py)
    b.plan.delete_pods.extend(p["metadata"]["name"] for p in current.values() if not is_deleting(p))


def restart(b: PlanBuilder, current: dict[int, dict[str, Any]], reason: str, message: str) -> None:
    new_attempt(b, current)
    b.status.pop("requeueAfter", None)
    b.phase("Restarting", reason, f"{message}; restarting the gang as attempt {b.status['attempt']} "
            "from the newest checkpoint", "Warning")  # fmt: skip


def delete_unfinished(b: PlanBuilder, current: dict[int, dict[str, Any]]) -> None:
    """Stops the attempt's pods that still run (those already finished keep their logs)."""
    b.plan.delete_pods.extend(
        p["metadata"]["name"] for p in current.values() if not is_terminal(p) and not is_deleting(p)
    )


def fail(b: PlanBuilder, current: dict[int, dict[str, Any]], reason: str, message: str) -> None:
    b.status["completionTime"] = b.now_iso
    delete_unfinished(b, current)
    b.phase("Failed", reason, message, "Warning")
