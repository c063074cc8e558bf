"""What a node event enqueues (controller/watch.py): the jobs with pods on that node, found through
the pod store's node index."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.cache import INDEX_NODE, slim_node
from phalanx.controller.stores import ClusterStores
from phalanx.controller.watch import WatchCallbacks

pytestmark = pytest.mark.unit


class Recorded:
    def __init__(self) -> None:
        self.jobs: list[str] = []
        self.admission = 0

    def enqueue_threadsafe(self, key: str) -> None:
        self.jobs.append(key)

    def admission_dirty_threadsafe(self) -> None:
        self.admission += 1


def pod(name: str, job: str, node: str, version: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": str(version),
                     "labels": {"phalanx.dev/job-name": job}},
        "spec": {"nodeName": node, "containers": [{"name": "trainer"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def node(name: str, ready: str, version: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": str(version)},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def test_a_node_that_goes_not_ready_enqueues_only_the_jobs_with_pods_there() -> None:
    stores, work = ClusterStores(), Recorded()
    for i, (job, where) in enumerate([("a", "n1"), ("a", "n2"), ("b", "n2"), ("c", "n3")]):
        stores.pods.upsert(pod(f"{job}-{i}", job, where, i + 1))
    callbacks = WatchCallbacks(stores, work)  # type: ignore[arg-type]
    callbacks.on_node_change("n2", slim_node(node("n2", "True", 1)), slim_node(node("n2", "Unknown", 2)))
    assert sorted(work.jobs) == ["ns/a", "ns/b"]
    work.jobs.clear()
    callbacks.on_node_change("n3", slim_node(node("n3", "True", 1)), None)  # deleted
    assert work.jobs == ["ns/c"]
    work.jobs.clear()
    callbacks.on_node_change("n1", slim_node(node("n1", "True", 1)), slim_node(node("n1", "True", 2)))
    assert work.jobs == []  # still Ready: nothing for the jobs to decide


def admitted(name: str, job: str, node_name: str, version: int) -> dict[str, Any]:
    """Admitted onto node_name and not bound yet (builders/pods.admitted_pod's pin)."""
    from phalanx.builders.pods import admitted_pod

    unbound = pod(name, job, "", version)
    unbound["spec"].pop("nodeName")
    unbound["status"] = {"phase": "Pending"}
    return admitted_pod(unbound, node_name)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}, ["ns/pinned"]),
        ({"spec": {"unschedulable": True}}, ["ns/pinned"]),
        ({"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}, ["ns/pinned"]),
        ({"spec": {"taints": [{"key": "gpu-health", "effect": "PreferNoSchedule"}]}}, []),
        ({"metadata": {"labels": {"zone": "b"}}}, []),  # left to the resync
    ],
    ids=["not-ready", "cordoned", "newly-tainted", "preference-only", "relabelled"],
)
def test_a_node_that_stops_taking_pods_enqueues_the_jobs_admitted_onto_it_too(
    change: dict[str, Any], expected: list[str]
) -> None:
    # Their pods are not bound yet, so no nodeName says where they are (rules/stranded.py decides).
    stores, work = ClusterStores(), Recorded()
    stores.pods.upsert(admitted("pinned-0", "pinned", "n1", 1))
    stores.pods.upsert(pod("elsewhere-0", "elsewhere", "n2", 2))
    callbacks = WatchCallbacks(stores, work)  # type: ignore[arg-type]
    before = node("n1", "True", 1)
    after = {
        **before,
        **change,
        "metadata": {**before["metadata"], "resourceVersion": "2", **change.get("metadata", {})},
    }
    callbacks.on_node_change("n1", slim_node(before), slim_node(after))
    assert work.jobs == expected


def test_the_node_index_follows_a_pod_from_the_gate_to_its_pin_to_its_binding_and_away() -> None:
    stores = ClusterStores()
    gated = pod("g-0", "g", "", 1)
    gated["spec"].pop("nodeName")
    gated["spec"]["schedulingGates"] = [{"name": "phalanx.dev/gang"}]
    gated["status"] = {"phase": "Pending"}
    stores.pods.upsert(gated)
    assert stores.pods.indexed("n1", index=INDEX_NODE) == []  # waiting: on no node yet
    stores.pods.upsert(admitted("g-0", "g", "n1", 2))
    assert [p["metadata"]["name"] for p in stores.pods.indexed("n1", index=INDEX_NODE)] == ["g-0"]
    stores.pods.upsert(pod("g-0", "g", "n1", 3))  # bound where it was pinned
    assert [p["metadata"]["name"] for p in stores.pods.indexed("n1", index=INDEX_NODE)] == ["g-0"]
    stores.pods.delete(pod("g-0", "g", "n1", 4))
    assert stores.pods.indexed("n1", index=INDEX_NODE) == []
