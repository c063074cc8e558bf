"""Topology-aware placement (spec.scheduling.topology) through the real API server, scheduler and
gang admission, on kwok nodes in 4 racks of 2 nodes (8 GPUs each)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.jobs import job_pods, job_status, training_job, wait_phase

pytestmark = pytest.mark.integration

RACK = "phalanx.dev/test-rack"


@pytest.fixture
def four_racks(private_nodes: Any) -> dict[str, str]:
    """node -> rack."""
    racks: dict[str, str] = {}
    for rack in ("ra", "rb", "rc", "rd"):
        for node in private_nodes.add(2, gpus=8, prefix=rack, labels={RACK: rack}):
            racks[node] = rack
    return racks


def rack_by_rank(cluster: Cluster, ns: str, name: str, racks: dict[str, str]) -> list[str]:
    pods = sorted(
        job_pods(cluster, ns, name), key=lambda p: int(p["metadata"]["labels"]["phalanx.dev/replica-index"])
    )
    return [racks[p["spec"]["nodeName"]] for p in pods]


def test_a_required_gang_never_spans_two_racks(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    private_nodes: Any,
    four_racks: dict[str, str],
) -> None:
    topology = {"key": RACK, "mode": "Required"}
    for name in ("req-a", "req-b", "req-c", "req-d"):  # 4 gangs of 2 whole nodes: one rack each
        cluster.apply(training_job(name, replicas=2, gpus=8, placement=private_nodes.placement(),
                                   scheduling={"topology": topology}), namespace)  # fmt: skip
    for name in ("req-a", "req-b", "req-c", "req-d"):
        wait_phase(cluster, namespace, name, "Running", timeout=60)
    used = [
        rack_by_rank(cluster, namespace, name, four_racks) for name in ("req-a", "req-b", "req-c", "req-d")
    ]
    assert all(len(set(racks)) == 1 for racks in used), used
    assert sorted(racks[0] for racks in used) == ["ra", "rb", "rc", "rd"]


def test_a_required_gang_no_rack_can_hold_waits_with_a_clear_message(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    private_nodes: Any,
    four_racks: dict[str, str],
) -> None:
    job = training_job("too-big", replicas=3, gpus=8, placement=private_nodes.placement(),
                       scheduling={"topology": {"key": RACK}})  # fmt: skip
    cluster.apply(job, namespace)
    message = wait_for(
        lambda: (job_status(cluster, namespace, "too-big").get("admissionMessage") or "") or None,
        timeout=60, what="the admission message",
    )  # fmt: skip
    assert f"no {RACK} domain has room for all 3 pods" in message and "closest:" in message, message
    assert job_status(cluster, namespace, "too-big").get("phase") == "Pending"
    assert not any(p["spec"].get("nodeName") for p in job_pods(cluster, namespace, "too-big"))


def test_preferred_spans_the_fewest_racks_with_consecutive_ranks(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    private_nodes: Any,
    four_racks: dict[str, str],
) -> None:
    job = training_job("pref", replicas=3, gpus=8, placement=private_nodes.placement(),
                       scheduling={"topology": {"key": RACK, "mode": "Preferred"}})  # fmt: skip
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "pref", "Running", timeout=60)
    by_rank = rack_by_rank(cluster, namespace, "pref", four_racks)
    assert len(set(by_rank)) == 2, by_rank  # 3 whole nodes need 2 racks of 2, never 3
    assert by_rank[0] == by_rank[1] != by_rank[2], by_rank  # ranks 0-1 in one rack, rank 2 in the next


def test_topology_needs_the_builtin_provider(cluster: Cluster, namespace: str) -> None:
    job = training_job("wrong", replicas=2, gpus=8,
                       scheduling={"provider": "volcano", "topology": {"key": RACK}})  # fmt: skip
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job), check=False)
    assert result.returncode != 0
    assert "spec.scheduling.topology needs spec.scheduling.provider builtin" in result.stderr, result.stderr
