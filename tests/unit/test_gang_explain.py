"""Waiting reasons read like a person wrote them, name the blocking cause and stay short."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.gang.admission import GangRequest, plan_admission
from phalanx.gang.capacity import NodeInfo, PodDemand
from phalanx.gang.explain import MAX_REASON_CHARS, describe_requests

pytestmark = pytest.mark.unit

GPU = "nvidia.com/gpu"


def node(
    name: str, taint: str | None = None, ready: str = "True", labels: dict[str, str] | None = None
) -> NodeInfo:
    taints = (
        [{"key": taint.split("=")[0], "value": taint.split("=")[1], "effect": "NoSchedule"}] if taint else []
    )
    return NodeInfo.from_k8s(
        {
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints},
            "status": {
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "8"},
                "conditions": [{"type": "Ready", "status": ready}],
            },
        }
    )


def gang(key: str, pods: int, resources: dict[str, str], **spec: Any) -> GangRequest:
    spec["containers"] = [{"name": "trainer", "resources": {"limits": resources}}]
    demand = PodDemand.from_pod_spec(spec)
    return GangRequest(key, 0, 0.0, tuple((f"{key}-{i}", demand) for i in range(pods)))


def test_the_issue_example_reads_as_promised() -> None:
    healthy = [node("node-a"), node("node-b"), node("node-c"), node("node-d")]
    nodes = healthy + [node(f"t{i}", taint="gpu=reserved") for i in range(3)]
    used = {"node-a": {GPU: 6000}, "node-d": {GPU: 8000}}
    plan = plan_admission([gang("ns/job", 4, {GPU: "8"})], nodes, used, now=0)
    assert plan.waiting["ns/job"] == (
        "needs 4 pods x 8 nvidia.com/gpu; only 2 nodes can host one "
        "(3 nodes tainted gpu=reserved:NoSchedule; 2 nodes short, best node-a: 2/8 nvidia.com/gpu free)"
    )


def test_room_on_shared_nodes_is_counted_in_pods() -> None:
    nodes = [node("a"), node("b")]
    plan = plan_admission([gang("ns/job", 4, {GPU: "4"})], nodes, {"a": {GPU: 4000}, "b": {GPU: 4000}}, now=0)
    assert plan.waiting["ns/job"].startswith("needs 4 pods x 4 nvidia.com/gpu; only 2 nodes can host one")
    plan = plan_admission([gang("ns/job", 6, {GPU: "2"})], nodes, {"a": {GPU: 4000}, "b": {GPU: 8000}}, now=0)
    assert plan.waiting["ns/job"].startswith("needs 6 pods x 2 nvidia.com/gpu; room for only 2 on 1 node")


def test_cpu_only_pods_are_described_by_cpu_and_memory() -> None:
    demand = PodDemand.from_pod_spec(
        {"containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "memory": "16Gi"}}}]}
    )
    assert describe_requests(demand) == "4 cpu, 16Gi memory"


def test_native_resources_with_a_prefix_are_not_named_as_accelerators() -> None:
    # The scheduler's rule (capacity.is_extended_resource): hugepages and kubernetes.io names are
    # native; a name in another domain is an accelerator, MIG slice or RDMA device.
    demand = PodDemand.from_pod_spec({"containers": [{"name": "c", "resources": {
        "requests": {"cpu": "4", "memory": "16Gi", "hugepages-2Mi": "1Gi", "example.kubernetes.io/slot": "1"},
        "limits": {"hugepages-2Mi": "1Gi", "nvidia.com/mig-1g.10gb": "1"}}}]})  # fmt: skip
    assert describe_requests(demand) == "1 nvidia.com/mig-1g.10gb"
    plain = PodDemand.from_pod_spec({"containers": [{"name": "c", "resources": {
        "requests": {"cpu": "4", "memory": "16Gi", "hugepages-2Mi": "1Gi"}, "limits": {"hugepages-2Mi": "1Gi"}}}]})  # fmt: skip
    assert describe_requests(plain) == "4 cpu, 16Gi memory"


def test_never_fits_names_the_largest_node() -> None:
    plan = plan_admission([gang("ns/huge", 2, {GPU: "16"})], [node("a"), node("b")], {}, now=0)
    assert plan.never_fits["ns/huge"] == (
        "needs 2 pods x 16 nvidia.com/gpu; even an empty cluster fails: no node can ever host one "
        "(2 nodes short, best a: 8 nvidia.com/gpu allocatable)"
    )


def test_selector_and_not_ready_causes_are_counted() -> None:
    nodes = [node("a", labels={"pool": "x"}), node("b", ready="False", labels={"pool": "x"}), node("c")]
    plan = plan_admission([gang("ns/job", 2, {GPU: "8"}, nodeSelector={"pool": "x"})], nodes, {}, now=0)
    reason = plan.waiting["ns/job"]
    assert "1 node not ready" in reason and "1 node outside nodeSelector/affinity" in reason


def test_reasons_stay_short_with_many_causes() -> None:
    nodes = [
        node(f"n{i:04d}-with-a-rather-long-name", taint=f"team{i}=reserved-for-a-long-time")
        for i in range(50)
    ]
    nodes += [node("spare")]
    plan = plan_admission(
        [gang("ns/job", 40, {GPU: "8", "example.com/very-long-extended-resource-name": "1"})],
        nodes,
        {},
        now=0,
    )
    reason = plan.never_fits["ns/job"]
    assert len(reason) <= MAX_REASON_CHARS + 1
    assert reason.startswith(
        "needs 40 pods x 1 example.com/very-long-extended-resource-name, 8 nvidia.com/gpu"
    )
