"""A node on which the job's pods failed twice with a device error is avoided by its next attempt
(policy/bad_nodes.py), against the real API server, scheduler and gang admission on kwok nodes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.jobs import job_pods, job_status, training_job

pytestmark = pytest.mark.integration

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."


def running_pod(cluster: Cluster, ns: str, name: str, attempt: int) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for pod in job_pods(cluster, ns, name):
            labels = pod["metadata"]["labels"]
            if labels["phalanx.dev/attempt"] == str(attempt) and pod["status"].get("phase") == "Running":
                return pod
        return None

    pod: dict[str, Any] = wait_for(found, timeout=60, what=f"attempt {attempt} running")
    return pod


def fail_with_a_device_error(cluster: Cluster, ns: str, pod: str) -> None:
    """kwok ends the pod at once with exit code 1 and the driver's Xid line as its termination
    message, as a trainer killed by a GPU fault leaves it (FallbackToLogsOnError)."""
    annotations = {"phalanx.dev/sim-run-for": "0s", "phalanx.dev/sim-exit-code": "1",
                   "phalanx.dev/sim-exit-message": XID}  # fmt: skip
    cluster.kubectl("patch", "pod", pod, "-n", ns, "--type=merge",
                    "-p", json.dumps({"metadata": {"annotations": annotations}}))  # fmt: skip


def test_a_node_that_failed_the_job_twice_is_avoided_by_its_next_attempt(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    nodes = private_nodes.add(2, gpus=8)
    job = training_job("flaky-gpu", replicas=1, gpus=8, placement=private_nodes.placement(),
                       terminate_after="1s", runPolicy={"backoffLimit": 5})  # fmt: skip
    cluster.apply(job, namespace)
    # Fail the pod wherever it lands until one node has failed twice (two nodes: three tries at most).
    failed_on: list[str] = []
    attempt = 0
    while not any(failed_on.count(n) >= 2 for n in nodes):
        pod = running_pod(cluster, namespace, "flaky-gpu", attempt)
        failed_on.append(pod["spec"]["nodeName"])
        fail_with_a_device_error(cluster, namespace, pod["metadata"]["name"])
        attempt += 1
        wait_for(lambda: job_status(cluster, namespace, "flaky-gpu").get("attempt") == attempt,  # noqa: B023
                 timeout=60, what=f"attempt {attempt}")  # fmt: skip
    bad = next(n for n in nodes if failed_on.count(n) >= 2)

    status = job_status(cluster, namespace, "flaky-gpu")
    assert status["restarts"]["failures"] == attempt  # a device error is retryable, whatever the code
    entry = next(e for e in status["badNodes"] if e["node"] == bad)
    assert entry["failures"] == 2 and set(entry["reasons"]) == {"DeviceError"} and entry["avoidedUntil"]
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=flaky-gpu")
    said = [e["message"] for e in events["items"] if e["reason"] == "BadNode"]
    assert len(said) == 1 and f"node {bad}:" in said[0], said

    # The next attempt runs, on the other node, and its pod is kept off the bad one.
    pod = running_pod(cluster, namespace, "flaky-gpu", attempt)
    assert pod["spec"]["nodeName"] != bad
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    avoid = {"key": "metadata.name", "operator": "NotIn", "values": [bad]}
    assert all(avoid in t.get("matchFields", []) for t in terms["nodeSelectorTerms"]), terms
