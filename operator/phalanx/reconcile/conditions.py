"""metav1.Condition bookkeeping (pure)."""

from __future__ import annotations

from typing import Any


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    now_iso: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Returns a new list with `type_` set; lastTransitionTime moves only when status changes."""
    out = [dict(c) for c in conditions if c.get("type") != type_]
    previous = next((c for c in conditions if c.get("type") == type_), None)
    transition = previous["lastTransitionTime"] if previous and previous.get("status") == status else now_iso
    condition: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": transition,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    out.append(condition)
    return sorted(out, key=lambda c: str(c["type"]))


def get_condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)
