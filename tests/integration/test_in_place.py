"""Restart in place against the real control plane, with kwok's simulated pods: they run no
resident launcher, so nobody answers the operator's POST of the generation. The in-place restart
is taken (only the lost pod deleted, the survivor kept), then falls back to a full restart, says
why in an InPlaceFallback event, and counts the disruption once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.jobs import job_pods, job_status, training_job, wait_phase

pytestmark = pytest.mark.integration


def uids(cluster: Cluster, ns: str, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(cluster, ns, name)}


def restart_counts(status: dict[str, Any]) -> dict[str, int]:
    restarts = status.get("restarts") or {}
    return {cause: int(restarts.get(cause) or 0) for cause in ("failures", "preemptions", "hangs")}


def events_of(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def test_an_unreachable_launcher_falls_back_to_a_full_restart_and_says_why(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    job = training_job("ip", replicas=2, terminate_after="1s", runPolicy={"restartStrategy": "InPlace"})
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "ip", "Running", timeout=60)
    before = uids(cluster, namespace, "ip")
    cluster.kubectl("delete", "pod", "ip-worker-1", "-n", namespace, "--wait=false")

    def running_again() -> dict[str, Any] | None:
        status = job_status(cluster, namespace, "ip")
        return status if status.get("attempt") == 2 and status.get("phase") == "Running" else None

    # Three tries of an unreachable launcher, the fallback's deletions and a second admission: 37-66 s
    # at load 10-13, and once over 90 s; the bound only stops a stuck run.
    status = wait_for(running_again, timeout=180, what="attempt 2 running")
    messages = [e["message"] for e in events_of(cluster, namespace, "ip")]
    # First the in-place attempt (worker-0 kept, only worker-1 replaced), then the fallback.
    assert any(
        "restarting in place as attempt 1: keeping ip-worker-0, replacing worker-1" in m for m in messages
    ), messages
    fallbacks = [e for e in events_of(cluster, namespace, "ip") if e["reason"] == "InPlaceFallback"]
    assert len(fallbacks) == 1 and fallbacks[0]["type"] == "Warning", messages
    # kwok's pod address is no launcher's: unreachable, or whatever answers there (not a 202).
    assert "the launcher of ip-worker-0 did not take the generation: " in fallbacks[0]["message"]
    assert "inPlace" not in status
    assert restart_counts(status) == {
        "failures": 0,
        "preemptions": 1,
        "hangs": 0,
    }  # one disruption, counted once
    assert status["lastRecovery"]["attempt"] == 2 and status["lastRecovery"]["path"] == "FullRestart"
    after = uids(cluster, namespace, "ip")
    assert sorted(after) == ["ip-worker-0", "ip-worker-1"] and not set(after.values()) & set(before.values())
