"""The watch-fed stores admission reads: newest revision wins, deletes stick, slim objects suffice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from phalanx.cache import (
    INDEX_NODE,
    TOMBSTONE_SECONDS,
    Store,
    compact,
    frees_or_changes_capacity,
    node_changed_for_admission,
    slim_node,
    slim_pod,
)
from phalanx.gang.capacity import NodeInfo, PodDemand
from phalanx.pod_facts import is_gated, job_of_pod, pod_attempt
from phalanx.policy.pod_outcome import classify_pod, node_is_ready
from tests.unit.reference_usage import usage_by_node

pytestmark = pytest.mark.unit


def pod(name: str, version: int, phase: str = "Pending", node: str = "", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": str(version),
            "labels": {"phalanx.dev/job-name": "llm", "phalanx.dev/attempt": "2"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            "annotations": {"big": "x" * 1000},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "trainer", "image": "trainer:1", "env": [{"name": "A", "value": "1"}],
                            "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "4"}}}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            **spec,
        },
        "status": {"phase": phase, "containerStatuses": [{"name": "trainer", "ready": False}]},
    }  # fmt: skip


def test_a_slim_pod_keeps_what_capacity_and_admission_read_and_drops_the_rest() -> None:
    full = pod(
        "w-0", 5, node="", schedulingGates=[{"name": "phalanx.dev/gang"}],
        nodeSelector={"pool": "a"}, tolerations=[{"key": "gpu", "operator": "Exists"}],
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}},
            "podAntiAffinity": {"x": 1}},
    )  # fmt: skip
    slim = slim_pod(full)
    assert PodDemand.from_pod_spec(slim["spec"]) == PodDemand.from_pod_spec(full["spec"])
    assert is_gated(slim) and pod_attempt(slim) == 2 and job_of_pod(slim) == "ns/llm"
    # The operator's own pods keep what a reconcile reads: metadata (the status: see below).
    assert (
        "managedFields" not in slim["metadata"]
        and slim["metadata"]["annotations"] == full["metadata"]["annotations"]
    )
    assert "env" not in slim["spec"]["containers"][0] and "volumes" not in slim["spec"]
    assert "podAntiAffinity" not in slim["spec"]["affinity"]
    bound = pod("w-1", 6, phase="Running", node="n1")
    assert usage_by_node([slim_pod(bound)]) == usage_by_node([bound])


def test_other_workloads_pods_keep_only_what_capacity_reads() -> None:
    foreign = pod("web-0", 3, phase="Running", node="n1")
    del foreign["metadata"]["labels"]["phalanx.dev/job-name"]
    slim = slim_pod(foreign)
    assert "annotations" not in slim["metadata"] and slim["status"] == {"phase": "Running"}
    assert job_of_pod(slim) is None
    assert usage_by_node([slim]) == usage_by_node([foreign])


def test_the_job_index_follows_upserts_deletes_and_lists() -> None:
    store = Store(slim_pod, index=job_of_pod)
    store.upsert(pod("llm-worker-0", 1))
    store.upsert(pod("llm-worker-1", 2))
    assert sorted(p["metadata"]["name"] for p in store.indexed("ns/llm")) == ["llm-worker-0", "llm-worker-1"]
    store.delete(pod("llm-worker-0", 3))
    assert [p["metadata"]["name"] for p in store.indexed("ns/llm")] == ["llm-worker-1"]
    relabelled = pod("llm-worker-1", 4)
    relabelled["metadata"]["labels"]["phalanx.dev/job-name"] = "other"
    store.upsert(relabelled)
    assert store.indexed("ns/llm") == [] and len(store.indexed("ns/other")) == 1
    store.replace([pod("llm-worker-2", 10)], list_version=10)
    assert [p["metadata"]["name"] for p in store.indexed("ns/llm")] == ["llm-worker-2"]
    assert store.indexed("ns/other") == []


def test_the_node_index_follows_binding_deletes_and_lists() -> None:
    store = Store(slim_pod, index=job_of_pod, by_node=True)
    store.upsert(pod("llm-worker-0", 1))  # not bound yet: on no node
    store.upsert(pod("llm-worker-1", 2, node="n1"))
    assert [p["metadata"]["name"] for p in store.indexed("n1", index=INDEX_NODE)] == ["llm-worker-1"]
    store.upsert(pod("llm-worker-0", 3, node="n1"))
    names = sorted(p["metadata"]["name"] for p in store.indexed("n1", index=INDEX_NODE))
    assert names == ["llm-worker-0", "llm-worker-1"]
    store.delete(pod("llm-worker-1", 4, node="n1"))
    assert [p["metadata"]["name"] for p in store.indexed("n1", index=INDEX_NODE)] == ["llm-worker-0"]
    store.replace([pod("llm-worker-2", 10, node="n2")], list_version=10)
    assert store.indexed("n1", index=INDEX_NODE) == []
    assert [p["metadata"]["name"] for p in store.indexed("n2", index=INDEX_NODE)] == ["llm-worker-2"]
    # the job index is still there beside it
    assert [p["metadata"]["name"] for p in store.indexed("ns/llm")] == ["llm-worker-2"]


def test_tombstones_are_pruned_after_their_time_without_a_list() -> None:
    now = [0.0]
    store = Store(slim_pod, clock=lambda: now[0])
    for i in range(100):
        store.upsert(pod(f"w-{i}", 2 * i + 1))
        store.delete(pod(f"w-{i}", 2 * i + 2))
    assert store.tombstones() == 100
    assert store.upsert(pod("w-0", 1)) is None  # a late reply within the time stays out
    now[0] = TOMBSTONE_SECONDS + 1
    store.upsert(pod("last", 500))
    store.delete(pod("last", 501))  # a delete after the time prunes the old ones
    assert store.tombstones() == 1


def test_a_slim_node_keeps_capacity_taints_labels_and_readiness_without_heartbeats() -> None:
    node = {
        "metadata": {
            "name": "n1",
            "resourceVersion": "9",
            "labels": {"zone": "z1"},
            "annotations": {"a": "b"},
        },
        "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "64"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2025-12-31T00:00:00Z",
                },
            ],
            "images": [{"names": ["a"] * 50}],
        },
    }
    slim = slim_node(node)
    assert NodeInfo.from_k8s(slim) == NodeInfo.from_k8s(node)
    assert node_is_ready(slim)
    # Since when it is (not) Ready stays: how long a node is not Ready decides when it counts as lost.
    assert "images" not in slim["status"] and slim["status"]["conditions"] == [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2025-12-31T00:00:00Z"}
    ]
    beat = {**node, "metadata": {**node["metadata"], "resourceVersion": "10"},
            "status": {**node["status"], "conditions": [{"type": "Ready", "status": "True",
                                                          "lastHeartbeatTime": "2026-01-01T00:00:40Z",
                                                          "lastTransitionTime": "2025-12-31T00:00:00Z"}]}}  # fmt: skip
    assert not node_changed_for_admission(slim, slim_node(beat))
    cordoned = {**node, "spec": {**node["spec"], "unschedulable": True}}
    assert node_changed_for_admission(slim, slim_node(cordoned))
    assert node_changed_for_admission(None, slim) and node_changed_for_admission(slim, None)


def test_the_newest_resource_version_wins_whatever_the_order_of_arrival() -> None:
    store = Store(slim_pod)
    assert store.upsert(pod("w-0", 7, phase="Running")) is not None
    assert store.upsert(pod("w-0", 5, phase="Pending")) is None  # a late watch event of an older state
    held = store.get("ns/w-0")
    assert held is not None and held["status"]["phase"] == "Running"
    changed = store.upsert(pod("w-0", 8, phase="Succeeded"))
    assert changed is not None and changed[0] is held and changed[1]["status"]["phase"] == "Succeeded"


def test_a_late_reply_does_not_bring_back_a_deleted_object() -> None:
    store = Store(slim_pod)
    store.upsert(pod("w-0", 5))
    assert store.delete(pod("w-0", 9)) is not None
    assert store.upsert(pod("w-0", 7)) is None and store.get("ns/w-0") is None
    assert store.upsert(pod("w-0", 12)) is not None  # recreated under the same name


def test_a_list_replaces_everything_except_objects_written_after_it() -> None:
    store = Store(slim_pod)
    store.upsert(pod("gone", 3))
    store.upsert(pod("assumed", 20))  # our own create, newer than the list below
    assert not store.synced.is_set()
    store.replace([pod("listed", 10)], list_version=15)
    assert store.synced.is_set()
    assert sorted(store.as_dict()) == ["ns/assumed", "ns/listed"]


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj["metadata"]["namespace"] = namespace
    return obj


def test_a_namespaces_list_replaces_that_namespace_only() -> None:
    """Reflectors for namespaces a and b share one store; b's list says nothing about a's objects."""
    store = Store(slim_pod)
    store.expect_lists(["a", "b"])
    store.replace([in_namespace(pod("x", 10), "a")], list_version=10, namespace="a")
    assert not store.synced.is_set()  # b has not listed: admission must not act on a alone
    store.upsert(in_namespace(pod("gone", 11), "b"))
    store.replace([in_namespace(pod("y", 12), "b")], list_version=12, namespace="b")
    assert store.synced.is_set()
    assert sorted(store.as_dict()) == ["a/x", "b/y"]
    store.delete(in_namespace(pod("x", 13), "a"))
    store.replace([in_namespace(pod("y", 12), "b")], list_version=14, namespace="b")
    assert store.get("a/x") is None  # a's deletion is remembered until a's own list
    assert store.upsert(in_namespace(pod("x", 12), "a")) is None  # a late reply stays deleted
    store.replace([in_namespace(pod("z", 15), "ab")], list_version=15, namespace="ab")
    assert sorted(store.as_dict()) == ["ab/z", "b/y"]  # "a" is not a prefix of "ab"


def test_capacity_changes_that_wake_admission() -> None:
    pending, running = slim_pod(pod("w", 1)), slim_pod(pod("w", 2, phase="Running", node="n1"))
    done = slim_pod(pod("w", 3, phase="Succeeded", node="n1"))
    assert not frees_or_changes_capacity(None, pending)
    assert not frees_or_changes_capacity(pending, running)
    assert frees_or_changes_capacity(running, done)
    assert frees_or_changes_capacity(running, None)


KUBELET_STATUSES = {
    "running": {
        "phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}], "hostIP": "10.255.0.1",
        "qosClass": "BestEffort", "startTime": "2026-01-01T00:00:00Z",
        "conditions": [
            {"type": "Ready", "status": "True", "lastProbeTime": None, "lastTransitionTime": "2026-01-01T00:00:05Z"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ],
        "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0, "image": "trainer:1",
                               "imageID": "sha256:ab", "containerID": "kwok://1",
                               "state": {"running": {"startedAt": "2026-01-01T00:00:04Z"}}}],
    },
    "checkpointed on SIGTERM": {
        "phase": "Failed", "podIP": "10.0.0.7",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                        "message": "Eviction API: evicting", "lastTransitionTime": "2026-01-01T00:01:00Z"}],
        "containerStatuses": [{"name": "trainer", "ready": False, "image": "trainer:1", "state": {"terminated": {
            "exitCode": 75, "reason": "Error", "message": "checkpointed", "startedAt": "2026-01-01T00:00:04Z",
            "finishedAt": "2026-01-01T00:01:20Z", "containerID": "kwok://1"}}}],
    },
    "init container failed": {
        "phase": "Failed",
        "initContainerStatuses": [{"name": "fetch", "state": {"terminated": {"exitCode": 2, "reason": "Error",
                                                                             "finishedAt": "2026-01-01T00:00:09Z"}}}],
        "containerStatuses": [{"name": "trainer", "state": {"waiting": {"reason": "PodInitializing"}}}],
    },
    "evicted": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
    "unschedulable": {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                        "lastProbeTime": None, "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    },
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(KUBELET_STATUSES))
def test_an_own_pods_slim_status_keeps_what_the_outcome_and_counters_read(case: str) -> None:
    full = pod("w-0", 4, phase="", node="n1")
    full["status"] = KUBELET_STATUSES[case]
    slim = slim_pod(full)
    node = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert classify_pod(slim, node=node) == classify_pod(full, node=node)
    kept = slim["status"]
    assert kept.get("podIP") == full["status"].get("podIP")
    assert kept.get("conditions", []) == [
        {k: v for k, v in x.items() if k != "lastProbeTime"} for x in full["status"].get("conditions", [])
    ]
    assert "podIPs" not in kept and "qosClass" not in kept and "image" not in str(kept)


def test_stored_copies_share_their_keys_and_short_strings_and_stay_equal() -> None:
    store = Store(slim_pod)
    first, second = pod("w-0", 1, phase="Running", node="n1"), pod("w-1", 2, phase="Running", node="n1")
    store.upsert(json.loads(json.dumps(first)))
    store.upsert(json.loads(json.dumps(second)))  # decoded apart: no string shared yet
    a, b = store.get("ns/w-0"), store.get("ns/w-1")
    assert a == slim_pod(first) and b == slim_pod(second)
    key_a = next(k for k in a["status"] if k == "phase")
    key_b = next(k for k in b["status"] if k == "phase")
    assert key_a is key_b and a["status"]["phase"] is b["status"]["phase"]
    long_value = "x" * 1000
    assert compact({"big": long_value})["big"] is long_value  # long strings are kept as they are
