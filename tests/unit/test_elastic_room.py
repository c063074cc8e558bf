"""CreationAdmission.room_for: the room an elastic gang is sized and grown by (policy/elastic.py), as
the admission pass would place its pods, off the nodes another blocked gang holds reserved."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx import constants as c
from phalanx.controller.admission_at_creation import CreationAdmission
from phalanx.controller.admission_state import AdmissionState
from phalanx.controller.stores import ClusterStores
from phalanx.policy.elastic import Room

pytestmark = pytest.mark.unit

GPU_POD = {"containers": [{"name": "trainer", "resources": {"requests": {"nvidia.com/gpu": "8"},
                                                           "limits": {"nvidia.com/gpu": "8"}}}]}  # fmt: skip


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def bound_pod(name: str, node_name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "other", "resourceVersion": "1"},
        "spec": {**GPU_POD, "nodeName": node_name},
        "status": {"phase": "Running"},
    }


def admission(nodes: list[str], pods: list[dict[str, Any]], listed: bool = True) -> CreationAdmission:
    stores = ClusterStores()
    if listed:
        stores.nodes.replace([node(n) for n in nodes], 1)
        stores.pods.replace(pods, 1)
        stores.jobs.replace([], 1)
    return CreationAdmission(stores, AdmissionState())


def test_room_counts_the_pods_that_fit_on_free_nodes_up_to_most() -> None:
    room = admission(["n0", "n1", "n2"], [bound_pod("busy", "n0")])
    assert room.room_for("ns/j", GPU_POD, 4, 0.0) == Room(2)
    assert room.room_for("ns/j", GPU_POD, 1, 0.0) == Room(1)


def test_nodes_reserved_for_another_blocked_gang_offer_no_room_but_the_gangs_own_do() -> None:
    room = admission(["n0", "n1", "n2"], [bound_pod("busy", "n0")])
    room.state.reservations = {"ns/head": ("n1",)}
    assert room.room_for("ns/j", GPU_POD, 4, 0.0) == Room(1)
    assert room.room_for("ns/head", GPU_POD, 4, 0.0) == Room(2)


def test_before_the_stores_are_listed_the_room_is_unknown() -> None:
    assert admission(["n0"], [], listed=False).room_for("ns/j", GPU_POD, 2, 0.0) is None


def gated_pod(name: str) -> dict[str, Any]:
    """A pod created for a gang that waits for the admission pass (gated, on no node yet)."""
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "spec": {**GPU_POD, "schedulingGates": [{"name": c.GANG_SCHEDULING_GATE}]},
        "status": {"phase": "Pending"},
    }


def test_room_one_gang_was_sized_into_is_not_offered_to_another_before_its_pods_are_placed() -> None:
    room = admission(["n0", "n1"], [])
    assert room.room_for("ns/a", GPU_POD, 2, 0.0, hold=True) == Room(2)
    # Sized in the same moment, before a's pods exist: the room is a's.
    assert room.room_for("ns/b", GPU_POD, 2, 0.0, hold=True) == Room(0)
    room.claim("ns/a", GPU_POD, pods=2, needed=2, names=["ns/a-0", "ns/a-1"], now=0.0)
    # a's pods created, waiting for the admission pass: still a's.
    room.stores.pods.upsert(gated_pod("a-0"))
    room.stores.pods.upsert(gated_pod("a-1"))
    assert room.room_for("ns/b", GPU_POD, 2, 1.0) == Room(0)
    assert room.room_for("ns/a", GPU_POD, 2, 1.0) == Room(2)  # its own claim does not count against it


def test_a_provisional_hold_not_followed_by_a_decision_is_dropped() -> None:
    room = admission(["n0", "n1"], [])
    assert room.room_for("ns/a", GPU_POD, 2, 0.0, hold=True) == Room(2)
    room.settle("ns/a")  # a decided nothing that needs the room
    assert room.room_for("ns/b", GPU_POD, 2, 0.0) == Room(2)


def test_a_claim_ends_once_its_pods_hold_their_nodes() -> None:
    room = admission(["n0", "n1", "n2"], [])
    room.claim("ns/a", GPU_POD, pods=1, needed=1, names=["ns/a-0"], now=0.0)
    assert room.room_for("ns/b", GPU_POD, 3, 0.0) == Room(2)
    placed = {
        **gated_pod("a-0"),
        "metadata": {"name": "a-0", "namespace": "ns", "resourceVersion": "2"},
        "spec": {**GPU_POD, "nodeName": "n0"},
        "status": {"phase": "Running"},
    }
    room.stores.pods.upsert(placed)
    assert room.room_for("ns/b", GPU_POD, 3, 1.0) == Room(2)  # counted once: as used, not claimed too
    assert "ns/a" not in room.state.claims


def test_one_free_node_is_granted_to_one_grow_and_the_growers_own_nodes_stay_its() -> None:
    a0 = {**bound_pod("a-0", "n0"), "metadata": {"name": "a-0", "namespace": "ns", "resourceVersion": "1"}}
    room = admission(["n0", "n1"], [a0, bound_pod("b-0", "n2")])
    # a grows from 1 to 2 into the free n1: the whole new gang, of which one pod more than a holds.
    room.claim("ns/a", GPU_POD, pods=2, needed=1, names=[], now=0.0)
    assert room.room_for("ns/b", GPU_POD, 2, 0.0) == Room(0)  # b does not restart for n1 too
    room.stores.pods.delete(a0)  # a's old pod is gone while it restarts: n0 is a's still
    assert room.room_for("ns/b", GPU_POD, 2, 1.0) == Room(0)
    assert room.room_for("ns/a", GPU_POD, 2, 1.0) == Room(2)


def own_pod(name: str, node_name: str) -> dict[str, Any]:
    return {
        **bound_pod(name, node_name),
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
    }


def test_a_grow_claim_survives_the_growers_later_passes_while_its_old_pods_terminate() -> None:
    """The reconciler's sequence (_decide): every pass reads the room with hold=True, then settles the
    hold when it decided nothing that takes it. After a grow's restart, each teardown pass of the grower
    reads the room again (no pod belongs to the new attempt yet) and creates nothing."""
    room = admission(["n0", "n1", "n2"], [own_pod("a-0", "n0"), own_pod("b-0", "n2")])
    assert room.room_for("ns/a", GPU_POD, 1, 0.0, hold=True) == Room(1)
    room.claim("ns/a", GPU_POD, pods=2, needed=1, names=(), now=0.0)  # a grows 1 -> 2 into n1
    assert room.room_for("ns/b", GPU_POD, 1, 0.5, hold=True) == Room(0)
    room.settle("ns/b")
    for now in (1.0, 2.0, 70.0, 200.0):  # a's old pod terminating: passes that create nothing
        room.room_for("ns/a", GPU_POD, 2, now, hold=True)
        room.settle("ns/a")
        # a long grace period, or a pod lingering on a NotReady node: n1 is a's still
        assert room.room_for("ns/b", GPU_POD, 1, now + 0.5, hold=True) == Room(0)
        room.settle("ns/b")
    # a's new attempt is sized and its pods created: their claim by name replaces the grow's
    room.claim("ns/a", GPU_POD, pods=2, needed=2, names=["ns/a-0-1", "ns/a-1-1"], now=201.0)
    assert room.state.claims["ns/a"].names == frozenset({"ns/a-0-1", "ns/a-1-1"})


def test_a_provisional_hold_does_not_replace_a_decided_claim() -> None:
    room = admission(["n0", "n1"], [])
    room.claim("ns/a", GPU_POD, pods=2, needed=2, names=(), now=0.0)
    room.room_for("ns/a", GPU_POD, 2, 1.0, hold=True)
    room.settle("ns/a")
    assert not room.state.claims["ns/a"].provisional
    assert room.room_for("ns/b", GPU_POD, 2, 1.5) == Room(0)


def test_a_grow_claims_only_the_pods_beyond_those_its_old_pods_hold_while_they_hold_them() -> None:
    room = admission(["n0", "n1", "n2", "n3"], [own_pod("a-0", "n0")])
    # a grows from 1 to 2: its old pod still holds n0 (counted as used), so one node more is a's
    room.claim("ns/a", GPU_POD, pods=2, needed=1, names=(), now=0.0, holding=["ns/a-0"])
    assert room.room_for("ns/b", GPU_POD, 4, 0.0) == Room(2)
    room.stores.pods.delete(own_pod("a-0", "n0"))  # gone: the node it freed is a's too
    assert room.room_for("ns/b", GPU_POD, 4, 1.0) == Room(2)
    assert room.room_for("ns/a", GPU_POD, 4, 1.0) == Room(4)


def test_a_grow_claim_ends_when_the_job_moves_past_its_attempt_or_stops() -> None:
    room = admission(["n0", "n1"], [])
    room.claim("ns/a", GPU_POD, pods=2, needed=1, names=(), now=0.0, grown_attempt=3)
    room.end_grow("ns/a", attempt=3, active=True)  # still restarting into attempt 3: kept
    assert room.room_for("ns/b", GPU_POD, 2, 1.0) == Room(0)
    room.end_grow("ns/a", attempt=4, active=True)  # restarted again before attempt 3 was created
    assert room.room_for("ns/b", GPU_POD, 2, 2.0) == Room(2)
    room.claim("ns/a", GPU_POD, pods=2, needed=1, names=(), now=3.0, grown_attempt=4)
    room.end_grow("ns/a", attempt=4, active=False)  # suspended, or finished
    assert room.room_for("ns/b", GPU_POD, 2, 4.0) == Room(2)


def test_pods_the_api_refused_are_no_longer_claimed() -> None:
    room = admission(["n0", "n1", "n2"], [])
    room.claim("ns/a", GPU_POD, pods=2, needed=2, names=["ns/a-0", "ns/a-1"], now=0.0)
    room.unclaim("ns/a", ["ns/a-1"])  # refused: it will not come
    assert room.room_for("ns/b", GPU_POD, 3, 1.0) == Room(2)
