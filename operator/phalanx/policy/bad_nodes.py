"""Nodes a job stays off for a while (pure): those on which its pods failed twice for reasons of
the infrastructure, not of the job's code.

Infrastructure failures: a node lost (NotReady past the bound, or deleted) under a running pod, a
device error in a pod's termination message (pod_outcome.DEVICE_ERROR_MARKERS), and a hang whose
silent pod ran there. At FAILURES_TO_AVOID of them on one node within REMEMBER_SECONDS, the job's
next placements keep off it (a required node affinity, which gang admission honours) until
REMEMBER_SECONDS after the last one; the record then goes. One failure is not enough: a preemption
of a whole zone or a one-off network blip should not shrink the nodes a job may use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from phalanx.policy.recovery_timeline import iso_ms, parse_time

FAILURES_TO_AVOID: Final = 2
REMEMBER_SECONDS: Final = 3600.0
MAX_RECORDED: Final = 16  # status stays small; the oldest records go first
MAX_REASONS: Final = 4


def record(
    bad_nodes: Sequence[Mapping[str, Any]] | None,
    failures: Iterable[tuple[str, str]],
    now: float,
) -> tuple[list[dict[str, Any]], list[str]]:
    """status.badNodes with this restart's (node, reason) failures added and expired records
    dropped; and the nodes that became avoided with it."""
    kept = [dict(n) for n in bad_nodes or () if now - (_last(n) or float("-inf")) < REMEMBER_SECONDS]
    by_node = {str(n["node"]): n for n in kept}
    newly_avoided: list[str] = []
    for node, reason in failures:
        entry = by_node.setdefault(node, {"node": node, "failures": 0, "reasons": []})
        if entry not in kept:
            kept.append(entry)
        before = int(entry.get("failures") or 0)
        entry["failures"] = before + 1
        entry["reasons"] = ([*(entry.get("reasons") or []), reason])[-MAX_REASONS:]
        entry["lastFailureTime"] = iso_ms(now)
        if entry["failures"] >= FAILURES_TO_AVOID:
            entry["avoidedUntil"] = iso_ms(now + REMEMBER_SECONDS)
            if before < FAILURES_TO_AVOID:
                newly_avoided.append(node)
    kept.sort(key=lambda n: _last(n) or 0.0)
    return kept[-MAX_RECORDED:], newly_avoided


def prune(bad_nodes: Sequence[Mapping[str, Any]] | None, now: float) -> list[dict[str, Any]]:
    """The records still remembered now."""
    return record(bad_nodes, (), now)[0]


def avoided(bad_nodes: Sequence[Mapping[str, Any]] | None, now: float) -> list[str]:
    """The nodes the job's next pods must stay off now."""
    return sorted(
        str(n["node"])
        for n in bad_nodes or ()
        if int(n.get("failures") or 0) >= FAILURES_TO_AVOID and (_until(n) or 0.0) > now
    )


def _last(entry: Mapping[str, Any]) -> float | None:
    return _parse(entry.get("lastFailureTime"))


def _until(entry: Mapping[str, Any]) -> float | None:
    return _parse(entry.get("avoidedUntil"))


def _parse(value: Any) -> float | None:
    return parse_time(value) if isinstance(value, str) else None
