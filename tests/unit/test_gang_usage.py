"""The incremental usage index answers what summing over every pod answers, change after change."""

from __future__ import annotations

import random
import sys
import threading
import time
from typing import Any

import pytest

from phalanx import constants as c
from phalanx.builders.pods import admitted_pod
from phalanx.cache import Store, object_key, slim_pod
from phalanx.gang.backfill import UNKNOWN_PRIORITY, PodOnNode
from phalanx.gang.capacity import as_resources, effective_requests, node_held
from phalanx.gang.on_creation import Assumed, add_in_flight, waits_for_admission
from phalanx.gang.usage import UsageIndex, holding_pod
from phalanx.pod_facts import is_gated, planned_node
from tests.unit.reference_usage import usage_by_node

pytestmark = pytest.mark.unit


def pin(node: str) -> dict[str, Any]:
    """The affinity admission writes (builders.pods.admitted_pod) to pin a pod to `node`."""
    affinity: dict[str, Any] = admitted_pod({"spec": {}}, node)["spec"]["affinity"]
    return affinity


NODES = ("a", "b", "c")


# The reference the index must equal: sums over every pod, as admission computed before it.
def planned_nodes(pods: list[Any]) -> dict[str, str]:
    return {object_key(p): node for p in pods if (node := planned_node(p)) is not None}


def someone_waits(pods: list[Any], reservations: dict[str, Any]) -> bool:
    return bool(reservations) or any(waits_for_admission(p) for p in pods)


def usage_with_assumed(pods: list[Any], assumed: Assumed) -> dict[str, dict[str, int]]:
    present = {object_key(p) for p in pods}
    return add_in_flight(usage_by_node(pods, planned_nodes(pods)), assumed, present.__contains__)


def without_zeros(used: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    nonzero = {node: {k: v for k, v in totals.items() if v} for node, totals in used.items()}
    return {node: totals for node, totals in nonzero.items() if totals}


def random_pod(rng: random.Random, name: str, version: int) -> dict[str, Any]:
    """Any state a pod passes through: gated, admitted (pinned), bound, finished, deleting."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "trainer",
                "resources": {
                    "requests": {"cpu": rng.choice(["100m", "1", "2"]), "memory": "1Gi"},
                    "limits": {"nvidia.com/gpu": str(rng.randint(0, 2))},
                },
            }
        ]
    }
    state = rng.choice(["gated", "admitted", "bound", "finished", "bound-elsewhere"])
    if state == "gated":
        spec["schedulingGates"] = [{"name": c.GANG_SCHEDULING_GATE}]
    if state in ("admitted", "bound", "finished"):
        spec["affinity"] = pin(rng.choice(NODES))
    if state in ("bound", "finished", "bound-elsewhere"):
        spec["nodeName"] = rng.choice(NODES)
    phase = {"finished": rng.choice(["Succeeded", "Failed"]), "bound": "Running"}.get(state, "Pending")
    labels = {c.LABEL_JOB_NAME: "job"} if rng.random() < 0.5 else {}
    if rng.random() < 0.2:
        labels[c.LABEL_SPARE] = "true"  # gated, yet no gang waits for it (waits_for_admission)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "resourceVersion": str(version),
        "labels": labels,
    }
    if rng.random() < 0.25:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # Terminating: holds its room until it stops
    if rng.random() < 0.2:  # a node agent (what the backfill reads of each holder follows the pod)
        metadata["ownerReferences"] = [{"kind": "DaemonSet", "name": "agent", "uid": "a", "controller": True}]
    if rng.random() < 0.5:
        spec["priority"] = rng.choice([0, 7, 1000])
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


def test_index_matches_the_sum_over_every_pod_through_creates_updates_deletes_and_relists() -> None:
    rng = random.Random(11)
    index = UsageIndex()
    store = Store(slim_pod, observer=index)
    store.replace([], 0)
    version = 0
    for step in range(600):
        version += 1
        name = f"p{rng.randint(0, 30)}"
        roll = rng.random()
        if roll < 0.2 and store.get(f"ns/{name}") is not None:
            store.delete({"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(version)}})
        elif roll < 0.23:
            # A re-list after a broken watch: the store, and so the index, start again from it.
            relisted = [random_pod(rng, f"p{i}", version) for i in range(rng.randint(0, 30))]
            store.replace(relisted, version)
        else:
            store.upsert(random_pod(rng, name, version))
        pods = store.items()
        assert index.used() == without_zeros(usage_by_node(pods, planned_nodes(pods))), f"step {step}"
        assert index.anyone_waits() == someone_waits(pods, {}), f"step {step}"
        # The admission pass's shortcut: nothing gated, nothing to admit (a spare included).
        assert index.anyone_gated() == any(is_gated(p) for p in pods), f"step {step}"
        terminating = [p for p in pods if p["metadata"].get("deletionTimestamp")]
        assert index.freeing() == without_zeros(usage_by_node(terminating, planned_nodes(terminating))), step
        # Creates in flight: counted unless the store already holds the pod (then the index does).
        in_flight = {f"ns/p{i}": (rng.choice(NODES), (("nvidia.com/gpu", 1000),)) for i in range(0, 31, 7)}
        assert index.used(in_flight) == without_zeros(usage_with_assumed(pods, in_flight)), f"step {step}"
        # The pods holding room on some nodes (early start reads them), found by node, not by scan.
        some = set(rng.sample(NODES, rng.randint(0, len(NODES))))
        # Each with what the backfill reads of it (usage.holding_pod), as the pod is now.
        expected = sorted(
            repr(holding_pod(p, node, as_resources(effective_requests(p["spec"]))))
            for p in pods
            if (node := node_held(p, planned_node(p))) in some
        )
        assert sorted(repr(p) for p in index.pods_on(some)) == expected, f"step {step}"


def test_what_the_backfill_reads_of_each_holder_follows_its_pod() -> None:
    # Taken once per pod change (holding_pod), read by every pass: the job by its label, bound only
    # once the scheduler bound it (admitted and pinned is not), its priority, and whether it is a
    # node agent; a pod with no priority set reads as the lowest.
    index = UsageIndex()
    store = Store(slim_pod, observer=index)
    store.replace([], 0)
    gpu = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    worker = {"metadata": {"name": "a-0", "namespace": "ns", "resourceVersion": "1", "labels": {c.LABEL_JOB_NAME: "a"}},
              "spec": {"priority": 7, "affinity": pin("n1"), "containers": [gpu]}, "status": {"phase": "Pending"}}  # fmt: skip
    agent = {"metadata": {"name": "dcgm", "namespace": "ns", "resourceVersion": "1",
                          "ownerReferences": [{"kind": "DaemonSet", "name": "d", "uid": "d", "controller": True}]},
             "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
             "status": {"phase": "Running"}}  # fmt: skip
    store.upsert(worker)
    store.upsert(agent)
    admitted = PodOnNode("n1", "ns/a", False, {"nvidia.com/gpu": 2000, "pods": 1000}, 7)
    agent_read = PodOnNode("n1", None, True, {"cpu": 1000, "pods": 1000}, UNKNOWN_PRIORITY, agent=True)
    assert sorted(index.pods_on({"n1"}), key=repr) == sorted([admitted, agent_read], key=repr)
    store.upsert({**worker, "metadata": {**worker["metadata"], "resourceVersion": "2"},
                  "spec": {**worker["spec"], "nodeName": "n1"}, "status": {"phase": "Running"}})  # fmt: skip
    bound = PodOnNode("n1", "ns/a", True, {"nvidia.com/gpu": 2000, "pods": 1000}, 7)
    assert sorted(index.pods_on({"n1", "n2"}), key=repr) == sorted([bound, agent_read], key=repr)
    assert index.pods_on({"n2"}) == []
    # A Deployment's pod is no agent, a static pod (its mirror owned by the Node) is one; neither
    # states a priority.
    for name, kind in (("web", "ReplicaSet"), ("static", "Node")):
        store.upsert({"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1",
                                   "ownerReferences": [{"kind": kind, "name": "o", "uid": name, "controller": True}]},
                      "spec": {"nodeName": "n2", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
                      "status": {"phase": "Running"}})  # fmt: skip
    cpu = {"cpu": 1000, "pods": 1000}
    web, static = (
        PodOnNode("n2", None, True, cpu, UNKNOWN_PRIORITY),
        PodOnNode("n2", None, True, cpu, UNKNOWN_PRIORITY, agent=True),
    )
    assert sorted(index.pods_on({"n2"}), key=repr) == sorted([web, static], key=repr)
    # Creates in flight count until the store holds their pod (then as that pod): no job, priority unknown.
    in_flight = {"ns/b-0": ("n2", (("nvidia.com/gpu", 1000),)), "ns/a-0": ("n1", (("nvidia.com/gpu", 2000),))}
    on_its_way = PodOnNode("n2", None, False, {"nvidia.com/gpu": 1000}, UNKNOWN_PRIORITY)
    assert sorted(index.pods_on({"n1", "n2"}, in_flight), key=repr) == sorted(
        [bound, agent_read, web, static, on_its_way], key=repr
    )
    assert sorted(index.pods_on({"n1"}, in_flight), key=repr) == sorted([bound, agent_read], key=repr)


def test_used_returns_a_copy_the_caller_may_change() -> None:
    index = UsageIndex()
    pod = random_pod(random.Random(1), "x", 1)
    pod["spec"].update(nodeName="a", schedulingGates=[])
    pod["status"]["phase"] = "Running"
    index.changed("ns/x", slim_pod(pod))
    used = index.used()
    used["a"]["cpu"] = -1
    assert index.used()["a"]["cpu"] > 0


def test_a_create_in_flight_is_counted_once_before_and_after_its_reply_is_stored() -> None:
    # The room of a gang admitted at creation must never be free: not while the create is in flight
    # (only `assumed` knows the pod), not once the reply is stored (the index knows it), and not in
    # between, which one read under one lock guarantees.
    index = UsageIndex()
    store = Store(slim_pod, observer=index)
    store.replace([], 0)
    gpu = (("nvidia.com/gpu", 1000), ("pods", 1000))
    in_flight = {"ns/p1": ("a", gpu)}
    before = index.used(in_flight)
    admitted = random_pod(random.Random(3), "p1", 1)
    admitted["spec"] = {
        "affinity": pin("a"),
        "containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    admitted["status"] = {"phase": "Pending"}
    store.upsert(admitted)
    after = index.used(in_flight)
    assert before == after == {"a": {"nvidia.com/gpu": 1000, "pods": 1000}}


def counted_gpus(used: dict[str, dict[str, int]]) -> int:
    return used.get("a", {}).get("nvidia.com/gpu", 0)


def race_reply_against_reads(read: Any, seconds: float = 0.5, until_seen: int | None = None) -> set[int]:
    """Stores and deletes the reply of an in-flight create over and over on another thread while
    `read` takes the room used; returns every GPU count (milli) `read` saw on node a."""
    index = UsageIndex()
    store = Store(slim_pod, observer=index)
    store.replace([], 0)
    reply = {
        "metadata": {"name": "p1", "namespace": "ns", "resourceVersion": "1"},
        "spec": {
            "affinity": pin("a"),
            "containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Pending"},
    }
    in_flight = {"ns/p1": ("a", (("nvidia.com/gpu", 1000),))}
    stop = threading.Event()

    def flap() -> None:
        version = 1
        while not stop.is_set():
            version += 1
            store.upsert({**reply, "metadata": {**reply["metadata"], "resourceVersion": str(version)}})
            version += 1
            store.delete({"metadata": {"name": "p1", "namespace": "ns", "resourceVersion": str(version)}})

    seen: set[int] = set()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so the race has a chance within the time
    flapper = threading.Thread(target=flap)
    flapper.start()
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and until_seen not in seen:
            seen.add(counted_gpus(read(index, store, in_flight)))
    finally:
        stop.set()
        flapper.join()
        sys.setswitchinterval(switch)
    return seen


def test_reads_under_one_lock_never_miss_a_create_whose_reply_is_being_stored() -> None:
    seen = race_reply_against_reads(lambda index, store, in_flight: index.used(in_flight))
    assert seen == {1000}, "the in-flight pod was counted once, always"


def test_the_race_the_single_lock_prevents_is_real() -> None:
    # Two reads, as before the fix: the totals, then whether the store holds the pod. A reply stored
    # in between is counted by neither; this test shows the harness can catch that.
    def two_reads(index: UsageIndex, store: Store, in_flight: Any) -> dict[str, dict[str, int]]:
        totals = index.used()
        return add_in_flight(totals, in_flight, lambda key: store.get(key) is not None)

    seen = race_reply_against_reads(two_reads, seconds=20.0, until_seen=0)
    assert 0 in seen, "the two-read version missed the pod at least once"
