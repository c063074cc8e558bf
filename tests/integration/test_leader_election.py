"""Two operators against one cluster: one leads and writes, the other stands by and takes over."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx.pod_facts import is_gated
from phalanx.ports import free_port
from tests.conftest import OPERATOR_IDENTITY_NAMESPACE, Cluster, OperatorProcess, wait_for
from tests.jobs import training_job

pytestmark = pytest.mark.integration

LEASE_SECONDS = 6  # short, so the test waits little; the bound below is stated in these terms
RETRY_SECONDS = 2  # leader.RETRY_PERIOD_SECONDS: how often a standby looks at the lease
JOBS = 20
GPUS_PER_NODE = 8


def gpus_of(pod: dict[str, Any]) -> int:
    limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
    return int(limits.get("nvidia.com/gpu", 0))


def pinned_node(pod: dict[str, Any]) -> str | None:
    """The node a pod is bound to, or that admission pinned it to (matchFields on metadata.name)."""
    if pod["spec"].get("nodeName"):
        return str(pod["spec"]["nodeName"])
    affinity = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in affinity.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                return str(field["values"][0])
    return None


def api_writes(candidate: OperatorProcess) -> float:
    """The write requests this operator sent (its phalanx_api_requests_total, any method but GET)."""
    import urllib.request

    port = candidate.metrics_port  # type: ignore[attr-defined]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("phalanx_api_requests_total{") and 'method="GET"' not in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def leading_at(log: str) -> bool:
    return "leading: reconciles, admission and progress polls start" in log


@pytest.fixture
def two_operators(
    cluster: Cluster, operator_process: OperatorProcess, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, OperatorProcess]]:
    """The session's operator steps aside (releasing the lease); two candidates with the chart's
    service account, RBAC and lease take its place (later tests restart it)."""
    operator_process.stop()
    pair = []
    for index in range(2):
        log_dir = tmp_path / f"op{index}"
        log_dir.mkdir()
        candidate = OperatorProcess(cluster, log_dir, Path(operator_process.kubeconfig))
        candidate.metrics_port = free_port()  # type: ignore[attr-defined]
        candidate.start(extra_args=["--lease-duration-seconds", str(LEASE_SECONDS),
                                    "--metrics-port", str(candidate.metrics_port)])  # type: ignore[attr-defined]  # fmt: skip
        pair.append(candidate)
    try:
        yield pair[0], pair[1]
    finally:
        for candidate in pair:
            candidate.stop()


def test_two_operators_one_leader_no_double_booking_and_a_warm_takeover(
    cluster: Cluster,
    namespace: str,
    private_nodes: Any,
    two_operators: tuple[OperatorProcess, OperatorProcess],
) -> None:
    first, second = two_operators
    names = private_nodes.add(3, gpus=GPUS_PER_NODE)
    placement = private_nodes.placement()
    leader, standby = wait_for(
        lambda: (first, second) if leading_at(first.log_text()) else (second, first) if leading_at(
            second.log_text()) else None,
        timeout=60, what="one operator to lead",
    )  # fmt: skip
    # 20 two-pod gangs of 1 to 3 GPUs each arrive over a few seconds: 24 GPUs cannot hold them all.
    for index in range(JOBS):
        cluster.apply(
            training_job(f"j{index}", replicas=2, gpus=1 + index % 3, placement=placement), namespace
        )
        time.sleep(0.1)

    def pods() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = cluster.get_json("pods", "-n", namespace, "-l", "phalanx.dev/job-name")[
            "items"
        ]
        return items

    def check_no_double_booking() -> list[dict[str, Any]]:
        current = pods()
        per_node: dict[str, int] = {}
        for pod in current:
            node = pinned_node(pod)
            if node and not is_gated(pod) and pod["status"].get("phase") not in ("Succeeded", "Failed"):
                per_node[node] = per_node.get(node, 0) + gpus_of(pod)
        overbooked = {node: used for node, used in per_node.items() if used > GPUS_PER_NODE}
        assert not overbooked, f"GPUs promised beyond capacity: {overbooked}"
        per_job: dict[str, int] = {}
        for pod in current:
            job = pod["metadata"]["labels"]["phalanx.dev/job-name"]
            per_job[job] = per_job.get(job, 0) + 1
        assert all(count <= 2 for count in per_job.values()), f"a gang with more than 2 pods: {per_job}"
        return current

    def running_jobs() -> dict[str, Any]:
        items = cluster.get_json("tj", "-n", namespace)["items"]
        return {
            j["metadata"]["name"]: j.get("status") or {}
            for j in items
            if (j.get("status") or {}).get("phase") == "Running"
        }

    wait_for(
        lambda: check_no_double_booking() and len(running_jobs()) >= 6, timeout=120, what="gangs running"
    )
    for _ in range(10):  # a few seconds of steady state under both operators
        check_no_double_booking()
        time.sleep(0.5)
    assert not leading_at(standby.log_text()), "both operators lead"
    assert api_writes(leader) > 0
    assert api_writes(standby) == 0, "the standby wrote to the API"

    before = {name: status.get("attempt", 0) for name, status in running_jobs().items()}
    before_pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods() if p["spec"].get("nodeName")}
    killed_at = time.monotonic()
    leader.kill()  # no release: the standby must wait the lease out
    wait_for(lambda: leading_at(standby.log_text()), timeout=LEASE_SECONDS + 4 * RETRY_SECONDS + 10,
             what="the standby to take over")  # fmt: skip
    took = time.monotonic() - killed_at
    # It takes over once it has seen no renewal for a lease duration, checked every retry period.
    assert took <= LEASE_SECONDS + 2 * RETRY_SECONDS + 3, f"takeover took {took:.1f}s"
    print(f"takeover after {took:.1f}s (lease {LEASE_SECONDS}s)")

    # Nothing running was disturbed: same attempts, same pods.
    time.sleep(3)
    after = running_jobs()
    assert {name: after.get(name, {}).get("attempt") for name in before} == before
    still = {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in pods() if p["metadata"]["name"] in before_pods
    }
    assert still == before_pods
    # And the new leader works: capacity freed by deleting running jobs goes to the waiting ones.
    for name in list(before)[:3]:
        cluster.kubectl("delete", "tj", name, "-n", namespace, "--wait=false")
    started = set(before)
    wait_for(lambda: check_no_double_booking() and bool(set(running_jobs()) - started), timeout=90,
             what="a waiting gang admitted by the new leader")  # fmt: skip
    assert names  # the private nodes existed throughout


def test_a_stopped_operator_exits_promptly_and_releases_its_lease(
    cluster: Cluster, operator_process: OperatorProcess, tmp_path: Path
) -> None:
    """SIGTERM (a rolling update, a drain): out well within the pod's 30 s grace, lease released, so
    the next operator leads at its next round instead of after a lease duration."""
    operator_process.stop()  # the session's operator steps aside (later tests restart it)
    candidate = OperatorProcess(cluster, tmp_path, Path(operator_process.kubeconfig))
    candidate.start()
    try:
        wait_for(lambda: leading_at(candidate.log_text()), timeout=60, what="the operator to lead")
        assert candidate.proc is not None
        began = time.monotonic()
        candidate.proc.terminate()
        candidate.proc.wait(timeout=20)
        assert time.monotonic() - began < 10, f"stopping took {time.monotonic() - began:.1f}s"
        holder = cluster.kubectl("get", "lease", "phalanx-operator", "-n", OPERATOR_IDENTITY_NAMESPACE,
                                 "-o", "jsonpath={.spec.holderIdentity}")  # fmt: skip
        assert holder.stdout == ""
    finally:
        candidate.kill()
