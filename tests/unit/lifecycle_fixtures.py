"""A job, its pods and the nodes, as the state machine's tests build them (shared by test_rule_*.py)."""

from __future__ import annotations

from typing import Any

from phalanx.reconcile.plan import iso

NOW = 1_800_000_000.0

NODES = {"n0": {"metadata": {"name": "n0"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}}


def job(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}, **spec},
        "status": status or {},
    }


def pod(
    index: int, attempt: int = 0, phase: str = "Running", exit_code: int | None = None, **extra: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True"}] if phase == "Running" else [],
    }
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": exit_code}}}]
    status.update(extra.pop("status", {}))
    return {
        "metadata": {"name": f"j-worker-{index}", "uid": f"p{index}-{attempt}",
                     "labels": {"phalanx.dev/replica-index": str(index), "phalanx.dev/attempt": str(attempt)},
                     **extra.pop("metadata", {})},
        "spec": {"nodeName": "n0", **extra.pop("spec", {})},
        "status": status,
    }  # fmt: skip


RUNNING = {
    "attempt": 0,
    "createdAttempt": 0,
    "phase": "Running",
    "admittedTime": iso(NOW - 60),
    "startTime": iso(NOW - 60),
}


def not_ready_node(name: str, since: float, status: str = "Unknown") -> dict[str, Any]:
    ready = {
        "type": "Ready",
        "status": status,
        "reason": "NodeStatusUnknown",
        "lastTransitionTime": iso(since),
    }
    return {"metadata": {"name": name}, "status": {"conditions": [ready]}}


def refused_at(ts: float) -> dict[str, Any]:
    return {"type": "PodsCreated", "status": "False", "reason": "CreateRefused",
            "message": 'pods "j-worker-1" is forbidden: exceeded quota', "lastTransitionTime": iso(ts)}  # fmt: skip
