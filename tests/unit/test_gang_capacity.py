"""Node capacity and pod demand: each dimension the scheduler filters on, in isolation."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.gang.capacity import (
    NodeInfo,
    NodeInfoCache,
    NodeSelectorTerm,
    PodDemand,
    Requirement,
    ResourceList,
    Taint,
    Toleration,
    effective_requests,
    placement_refusal,
    resource_refusal,
)
from tests.unit.reference_usage import usage_by_node

pytestmark = pytest.mark.unit


def node_can_host(node: NodeInfo, demand: PodDemand, used: ResourceList) -> tuple[bool, str]:
    """Whether one more pod of this demand fits on the node now, and if not, why (short)."""
    refusal = placement_refusal(node, demand) or resource_refusal(node, demand, used)
    if refusal is None:
        return True, "fits"
    return False, f"{node.name}: {refusal.detail}"


GIB = 2**30 * 1000  # one GiB in milli-units


def node_json(
    name: str = "node-a",
    allocatable: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    ready: str = "True",
    unschedulable: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "allocatable": allocatable
            or {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}],
        },
    }


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "trainer", "image": "x", "resources": resources}


def demand(**spec: Any) -> PodDemand:
    spec.setdefault("containers", [container({"cpu": "1"})])
    return PodDemand.from_pod_spec(spec)


def test_node_from_k8s_reads_allocatable_labels_taints_and_readiness() -> None:
    node = NodeInfo.from_k8s(
        node_json(labels={"pool": "a100"}, taints=[{"key": "gpu", "value": "x", "effect": "NoSchedule"}])
    )
    assert node.name == "node-a"
    expected = {"cpu": 32000, "memory": 256 * GIB, "pods": 110000, "nvidia.com/gpu": 8000}
    assert dict(node.allocatable) == expected
    assert node.labels == {"pool": "a100"}
    assert node.taints == (Taint("gpu", "x", "NoSchedule"),)
    assert node.ready and not node.unschedulable


def test_node_without_ready_condition_is_not_ready() -> None:
    raw = node_json()
    raw["status"]["conditions"] = []
    assert not NodeInfo.from_k8s(raw).ready


def test_node_falls_back_to_capacity_when_allocatable_is_missing() -> None:
    raw = node_json()
    raw["status"] = {"capacity": {"cpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}
    assert dict(NodeInfo.from_k8s(raw).allocatable) == {"cpu": 4000}


def test_requests_sum_containers_and_count_the_pod() -> None:
    spec = {"containers": [container({"cpu": "500m", "memory": "1Gi"}), container({"cpu": "1500m"})]}
    assert effective_requests(spec) == {"cpu": 2000, "memory": GIB, "pods": 1000}


def test_limits_stand_in_for_missing_requests() -> None:
    spec = {"containers": [container({"cpu": "1"}, {"cpu": "4", "nvidia.com/gpu": "8", "memory": "2Gi"})]}
    # cpu keeps its explicit request; gpu and memory default to their limits.
    assert effective_requests(spec) == {"cpu": 1000, "nvidia.com/gpu": 8000, "memory": 2 * GIB, "pods": 1000}


def test_init_containers_take_the_max_not_the_sum() -> None:
    spec = {
        "initContainers": [
            container({"cpu": "3", "memory": "1Gi"}),
            container({"cpu": "1", "memory": "8Gi"}),
        ],
        "containers": [container({"cpu": "2", "memory": "4Gi"})],
    }
    assert effective_requests(spec) == {"cpu": 3000, "memory": 8 * GIB, "pods": 1000}


def test_sidecar_init_containers_add_to_everything_after_them() -> None:
    sidecar = container({"cpu": "1"}) | {"restartPolicy": "Always"}
    spec = {
        "initContainers": [sidecar, container({"cpu": "4"})],
        "containers": [container({"cpu": "2"})],
        "overhead": {"cpu": "100m"},
    }
    # max(app 2 + sidecar 1, init 4 + sidecar 1) + overhead 0.1
    assert effective_requests(spec)["cpu"] == 5100


def test_usage_counts_bound_active_pods_and_planned_ones_only() -> None:
    def pod(name: str, node: str | None, phase: str, cpu: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [container({"cpu": cpu})]}
        if node:
            spec["nodeName"] = node
        return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": {"phase": phase}}

    deleting = pod("deleting", "a", "Running", "8")
    deleting["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    pods = [
        pod("running", "a", "Running", "1"),
        pod("bound-pending", "a", "Pending", "2"),
        pod("done", "a", "Succeeded", "4"),
        pod("failed", "b", "Failed", "4"),
        pod("gated", None, "Pending", "16"),
        pod("admitted", None, "Pending", "3"),
        deleting,
    ]
    usage = usage_by_node(pods, admitted_unbound={"ns/admitted": "b"})
    assert usage == {"a": {"cpu": 11000, "pods": 3000}, "b": {"cpu": 3000, "pods": 1000}}


GPU_POD = {"containers": [container(limits={"nvidia.com/gpu": "4"})]}


@pytest.mark.parametrize(
    ("used", "fits", "reason"),
    [
        ({}, True, "fits"),
        ({"nvidia.com/gpu": 4000}, True, "fits"),
        ({"nvidia.com/gpu": 6000}, False, "node-a: 2/8 nvidia.com/gpu free"),
        ({"nvidia.com/gpu": 9000}, False, "node-a: 0/8 nvidia.com/gpu free"),
    ],
)
def test_gpu_dimension(used: dict[str, int], fits: bool, reason: str) -> None:
    node = NodeInfo.from_k8s(node_json())
    assert node_can_host(node, PodDemand.from_pod_spec(GPU_POD), used) == (fits, reason)


@pytest.mark.parametrize(
    ("request_", "used", "fits", "short"),
    [
        ({"cpu": "4"}, {"cpu": 28000}, True, ""),
        ({"cpu": "4"}, {"cpu": 28001}, False, "cpu"),
        ({"memory": "16Gi"}, {"memory": 240 * GIB + 1}, False, "memory"),
        ({"memory": "16Gi"}, {"memory": 240 * GIB}, True, ""),
        ({"cpu": "1"}, {"pods": 110000}, False, "pods"),
        ({"nvidia.com/mig-1g.10gb": "1"}, {}, False, "nvidia.com/mig-1g.10gb"),
        ({"example.com/fpga": "1"}, {}, False, "example.com/fpga"),
        ({"cpu": "0", "memory": "0"}, {}, True, ""),
    ],
)
def test_every_resource_dimension_is_checked(
    request_: dict[str, str], used: dict[str, int], fits: bool, short: str
) -> None:
    ok, reason = node_can_host(NodeInfo.from_k8s(node_json()), demand(containers=[container(request_)]), used)
    assert ok is fits
    assert short in reason if short else reason == "fits"


def test_mig_profiles_are_not_interchangeable() -> None:
    node = NodeInfo.from_k8s(
        node_json(allocatable={"nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "7", "pods": "110"})
    )
    small = demand(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1"})])
    large = demand(containers=[container(limits={"nvidia.com/mig-3g.40gb": "1"})])
    assert node_can_host(node, small, {"nvidia.com/mig-1g.10gb": 6000})[0]
    assert not node_can_host(node, small, {"nvidia.com/mig-1g.10gb": 7000})[0]
    assert node_can_host(node, large, {"nvidia.com/mig-1g.10gb": 7000})[0]


def test_not_ready_and_cordoned_nodes_host_nothing() -> None:
    not_ready = NodeInfo.from_k8s(node_json(ready="False"))
    assert node_can_host(not_ready, demand(), {}) == (False, "node-a: not ready")
    assert node_can_host(NodeInfo.from_k8s(node_json(ready="Unknown")), demand(), {})[0] is False
    cordoned = NodeInfo.from_k8s(node_json(unschedulable=True))
    assert node_can_host(cordoned, demand(), {}) == (False, "node-a: cordoned")
    tolerant = demand(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}])
    assert node_can_host(cordoned, tolerant, {})[0]


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (
            {"key": "gpu", "operator": "Equal", "value": "x", "effect": "NoSchedule"},
            ("gpu", "x", "NoSchedule"),
            1,
        ),
        ({"key": "gpu", "value": "x"}, ("gpu", "x", "NoExecute"), True),  # empty effect: all effects
        ({"key": "gpu", "value": "y"}, ("gpu", "x", "NoSchedule"), False),
        ({"key": "gpu", "operator": "Exists"}, ("gpu", "anything", "NoSchedule"), True),
        ({"operator": "Exists"}, ("whatever", "v", "NoExecute"), True),  # empty key + Exists: all taints
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, ("gpu", "x", "NoSchedule"), False),
        ({"key": "other", "operator": "Exists"}, ("gpu", "x", "NoSchedule"), False),
    ],
)
def test_toleration_matching(toleration: dict[str, str], taint: tuple[str, str, str], tolerated: int) -> None:
    assert Toleration.from_k8s(toleration).tolerates(Taint(*taint)) is bool(tolerated)


@pytest.mark.parametrize(
    ("effect", "fits"), [("NoSchedule", False), ("NoExecute", False), ("PreferNoSchedule", True)]
)
def test_only_hard_taint_effects_block(effect: str, fits: bool) -> None:
    node = NodeInfo.from_k8s(node_json(taints=[{"key": "gpu", "value": "reserved", "effect": effect}]))
    ok, reason = node_can_host(node, demand(), {})
    assert ok is fits
    if not fits:
        assert reason == f"node-a: tainted gpu=reserved:{effect}"
    tolerant = demand(tolerations=[{"key": "gpu", "operator": "Equal", "value": "reserved"}])
    assert node_can_host(node, tolerant, {})[0]


def test_node_selector_must_match_every_label() -> None:
    node = NodeInfo.from_k8s(node_json(labels={"pool": "a100", "zone": "z1"}))
    assert node_can_host(node, demand(nodeSelector={"pool": "a100"}), {})[0]
    assert node_can_host(node, demand(nodeSelector={"pool": "a100", "zone": "z1"}), {})[0]
    ok, reason = node_can_host(node, demand(nodeSelector={"pool": "h100"}), {})
    assert not ok and "nodeSelector pool=h100" in reason


LABELS = {"pool": "a100", "gpus": "8", "zone": "z1"}


@pytest.mark.parametrize(
    ("operator", "key", "values", "matches"),
    [
        ("In", "pool", ["a100", "h100"], True),
        ("In", "pool", ["h100"], False),
        ("In", "absent", ["x"], False),
        ("NotIn", "pool", ["h100"], True),
        ("NotIn", "pool", ["a100"], False),
        ("NotIn", "absent", ["x"], True),
        ("Exists", "zone", [], True),
        ("Exists", "absent", [], False),
        ("DoesNotExist", "absent", [], True),
        ("DoesNotExist", "zone", [], False),
        ("Gt", "gpus", ["4"], True),
        ("Gt", "gpus", ["8"], False),
        ("Lt", "gpus", ["9"], True),
        ("Lt", "gpus", ["8"], False),
        ("Gt", "pool", ["1"], False),  # not an integer label
        ("Gt", "absent", ["1"], False),
        ("Bogus", "pool", ["a100"], False),
    ],
)
def test_affinity_operators(operator: str, key: str, values: list[str], matches: bool) -> None:
    assert Requirement(key, operator, tuple(values)).matches(LABELS) is matches


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]
            }
        }
    }


def test_required_affinity_terms_are_ored_and_expressions_anded() -> None:
    node = NodeInfo.from_k8s(node_json(labels=LABELS))
    wrong_pool = {"key": "pool", "operator": "In", "values": ["h100"]}
    right_zone = {"key": "zone", "operator": "In", "values": ["z1"]}
    big = {"key": "gpus", "operator": "Gt", "values": ["4"]}
    assert node_can_host(node, demand(affinity=affinity([wrong_pool], [right_zone, big])), {})[0]
    ok, reason = node_can_host(node, demand(affinity=affinity([wrong_pool, right_zone])), {})
    assert not ok and "affinity" in reason


def test_affinity_match_fields_select_by_node_name() -> None:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
    assert NodeSelectorTerm.from_k8s(term).matches("node-a", {})
    assert not NodeSelectorTerm.from_k8s(term).matches("node-b", {})


def test_empty_affinity_term_selects_nothing() -> None:
    node = NodeInfo.from_k8s(node_json())
    assert not node_can_host(node, demand(affinity=affinity([])), {})[0]


def test_preferred_affinity_does_not_restrict() -> None:
    node = NodeInfo.from_k8s(node_json())
    preferred = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}
    assert node_can_host(node, demand(affinity=preferred), {})[0]


def test_node_info_cache_parses_a_node_again_only_when_what_it_reads_changed() -> None:
    def node(version: str, gpus: str, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
        return {
            "metadata": {"name": "n1", "resourceVersion": version, "labels": {"pool": "a"}},
            "spec": {"taints": taints} if taints else {},
            "status": {
                "allocatable": {"nvidia.com/gpu": gpus},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }

    cache = NodeInfoCache()
    [first] = cache.infos([node("1", "8")])
    [after_heartbeat] = cache.infos([node("2", "8")])  # a new copy, same facts
    assert after_heartbeat is first
    [resized] = cache.infos([node("3", "4")])
    assert resized is not first and resized.allocatable_of("nvidia.com/gpu") == 4000
    [tainted] = cache.infos([node("4", "4", [{"key": "k", "effect": "NoSchedule"}])])
    assert tainted is not resized and len(tainted.taints) == 1
    assert cache.infos([]) == []  # a deleted node leaves the cache
    [again] = cache.infos([node("5", "4", [{"key": "k", "effect": "NoSchedule"}])])
    assert again is not tainted


def test_node_set_is_the_same_while_no_node_changed_and_a_new_one_when_one_did() -> None:
    def node(
        name: str, version: str, gpus: str = "8", taints: list[dict[str, str]] | None = None
    ) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "resourceVersion": version},
            "spec": {"taints": taints} if taints else {},
            "status": {
                "allocatable": {"nvidia.com/gpu": gpus},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }

    cache = NodeInfoCache()
    first = cache.node_set([node("a", "1"), node("b", "1")])
    assert first.remember("answer", lambda: 1) == 1
    # Heartbeats: new copies, same facts. The set and what it remembered stay.
    again = cache.node_set([node("a", "2"), node("b", "2")])
    assert again is first and again.remember("answer", lambda: 2) == 1
    for changed in (
        [node("a", "3", gpus="4"), node("b", "2")],  # resized
        [node("a", "3", taints=[{"key": "k", "effect": "NoSchedule"}]), node("b", "2")],  # tainted
        [node("a", "2")],  # b deleted
        [node("a", "2"), node("b", "2"), node("c", "1")],  # c added
    ):
        fresh = cache.node_set(changed)
        assert fresh is not first and fresh.remember("answer", lambda: 2) == 2
        assert [info.name for info in fresh] == [n["metadata"]["name"] for n in changed]
        first = fresh


def test_node_set_eligibility_follows_taints_and_readiness() -> None:
    cache = NodeInfoCache()
    gpu = PodDemand(requests=(("nvidia.com/gpu", 1000),))

    def nodes(b_taints: list[dict[str, str]], b_ready: str) -> list[dict[str, Any]]:
        return [
            {"metadata": {"name": name}, "spec": {"taints": taints},
             "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": ready}]}}
            for name, taints, ready in (("a", [], "True"), ("b", b_taints, b_ready))
        ]  # fmt: skip

    plain = cache.node_set(nodes([], "True"))
    assert plain.refusal_table(gpu, ever=False)[0] == ["a", "b"]
    tainted = cache.node_set(nodes([{"key": "k", "effect": "NoSchedule"}], "True"))
    assert tainted.refusal_table(gpu, ever=False)[0] == ["a"]
    assert tainted.refusal_table(gpu, ever=True)[0] == ["a"]
    not_ready = cache.node_set(nodes([], "False"))
    assert not_ready.refusal_table(gpu, ever=False)[0] == ["a"]
    assert not_ready.refusal_table(gpu, ever=True)[0] == ["a", "b"]  # it may recover


def test_an_evicting_taint_tolerated_for_a_while_only_keeps_a_gang_off_the_node() -> None:
    """Bound there, the pod would be evicted once tolerationSeconds pass (the scheduler binds it all
    the same): admission places no gang there, or the stranded rule would tear it down, over and over."""
    taint = {"key": "nvidia.com/gpu-unhealthy", "value": "xid-79", "effect": "NoExecute"}
    node = NodeInfo.from_k8s(node_json(taints=[taint]))
    for_a_while = {
        "key": "nvidia.com/gpu-unhealthy",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 60,
    }
    for_good = {"key": "nvidia.com/gpu-unhealthy", "operator": "Exists", "effect": "NoExecute"}
    at_once = {**for_a_while, "tolerationSeconds": -5}

    def refusal(*tolerations: dict[str, Any]) -> str | None:
        found = placement_refusal(
            node, PodDemand.from_pod_spec({"tolerations": list(tolerations), "containers": []})
        )
        return None if found is None else found.text

    assert refusal() == "tainted nvidia.com/gpu-unhealthy=xid-79:NoExecute"
    assert (
        refusal(for_a_while) == "tainted nvidia.com/gpu-unhealthy=xid-79:NoExecute, tolerated for 60 s only"
    )
    assert refusal(at_once) == "tainted nvidia.com/gpu-unhealthy=xid-79:NoExecute, tolerated for 0 s only"
    assert refusal(for_a_while, for_good) is not None  # the first that matches decides
    assert refusal(for_good, for_a_while) is None
