"""After every decision: a restart caused by the infrastructure (a lost node, a device error, a
hang's silent pod) is booked against the node in status.badNodes; a node at its second such
failure is avoided by the job's next placements for a while (policy/bad_nodes.py), said in a
Warning event. rules/creation.py keeps the new pods off it (pure)."""

from __future__ import annotations

from typing import Any

from phalanx.policy import bad_nodes
from phalanx.policy.hang import REASON_HANG
from phalanx.policy.pod_outcome import REASON_DEVICE_ERROR, REASON_NODE_LOST
from phalanx.policy.recovery_timeline import restart_counted
from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import Event, PlanBuilder

INFRASTRUCTURE_REASONS = (REASON_NODE_LOST, REASON_DEVICE_ERROR)


def apply(b: PlanBuilder, seen: Observed) -> bool:
    known = b.old.get("badNodes")
    if not restart_counted(b.old, b.status):
        if known and len(pruned := bad_nodes.prune(known, b.now)) != len(known):
            _set(b, pruned)  # what is past REMEMBER_SECONDS goes
        return False
    failures = _failures(b, seen)
    if not failures and not known:
        return False
    recorded, newly = bad_nodes.record(known, failures, b.now)
    _set(b, recorded)
    for node in newly:
        entry = next(e for e in recorded if e["node"] == node)
        b.plan.events.append(Event("Warning", "BadNode", (
            f"node {node}: {entry['failures']} infrastructure failures of this job "
            f"({', '.join(entry['reasons'])}); its next pods keep off it until {entry['avoidedUntil']}"
        )))  # fmt: skip
    return False


def _failures(b: PlanBuilder, seen: Observed) -> list[tuple[str, str]]:
    by_name = {p["metadata"]["name"]: p for p in seen.current.values()}
    failed: list[tuple[str, str]] = []
    for outcome in seen.outcomes:
        node = _node_of(by_name.get(outcome.pod))
        if outcome.reason in INFRASTRUCTURE_REASONS and node:
            failed.append((node, outcome.reason))
    hangs = int((b.status.get("restarts") or {}).get("hangs", 0)) > int(
        (b.old.get("restarts") or {}).get("hangs", 0)
    )
    silent = (seen.trainer_report or {}).get("silent_pods") if hangs else None
    for name in silent if isinstance(silent, list) else ():
        node = _node_of(by_name.get(str(name)))
        if node:
            failed.append((node, REASON_HANG))
    # One booking per node per restart: a lost node under two of the job's pods is one incident.
    first: dict[str, str] = {}
    for node, reason in failed:
        first.setdefault(node, reason)
    return list(first.items())


def _node_of(pod: dict[str, Any] | None) -> str | None:
    node = ((pod or {}).get("spec") or {}).get("nodeName")
    return str(node) if node else None


def _set(b: PlanBuilder, records: list[dict[str, Any]]) -> None:
    if records:
        b.status["badNodes"] = records
    else:
        b.status.pop("badNodes", None)
