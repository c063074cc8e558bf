"""After every decision: the ranks rank 0's trainer reports as stragglers (docs/trainer.md
"Stragglers") go into status.stragglers with their pod and node, and the Straggler condition says
so; both clear when the trainer reports none or the attempt stops running (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phalanx.reconcile.observed import Observed
from phalanx.reconcile.plan import Event, PlanBuilder

MAX_STRAGGLERS = 8


def apply(b: PlanBuilder, seen: Observed) -> bool:
    found = _stragglers(b, seen)
    was = [s.get("rank") for s in b.old.get("stragglers") or []]
    if found:
        b.status["stragglers"] = found
        message = "; ".join(
            f"rank {s['rank']} (pod {s['pod']} on node {s['node']}) {s['ratio']}x the others' median "
            f"data wait + forward for {s['steps']} logged steps in a row"
            for s in found
        )
        b.condition("Straggler", "True", "SlowRank", message)
        if [s["rank"] for s in found] != was:
            b.plan.events.append(Event("Warning", "Straggler", message))
    elif was or any(c["type"] == "Straggler" and c["status"] == "True" for c in b.status["conditions"]):
        b.status.pop("stragglers", None)
        b.condition("Straggler", "False", "NoStraggler", "no rank is slower than its peers")
    return False


def _stragglers(b: PlanBuilder, seen: Observed) -> list[dict[str, Any]]:
    report = seen.trainer_report
    if b.status.get("phase") != "Running" or report is None or report.get("attempt") != seen.attempt:
        return []
    reported = report.get("stragglers")
    if not isinstance(reported, list):
        return []
    procs = max(1, seen.spec.effective_procs_per_replica)
    out = []
    for item in reported[:MAX_STRAGGLERS]:
        rank, ratio, steps = _field(item, "rank"), _number(item, "ratio"), _field(item, "steps")
        if rank is None or ratio is None or steps is None:
            continue
        pod = seen.current.get(rank // procs) or {}
        out.append({
            "rank": rank,
            "pod": (pod.get("metadata") or {}).get("name", f"worker-{rank // procs}"),
            "node": (pod.get("spec") or {}).get("nodeName") or "unknown",
            "ratio": f"{ratio:.1f}",
            "steps": steps,
        })  # fmt: skip
    return out


def _field(item: Any, key: str) -> int | None:
    value = item.get(key) if isinstance(item, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(item: Any, key: str) -> float | None:
    value = item.get(key) if isinstance(item, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
