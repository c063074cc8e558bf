"""CreationAdmission.room_for: the room an elastic gang is sized and grown by (policy/elastic.py), as
the admission pass would place its pods, off the nodes another blocked gang holds reserved."""

from __future__ import annotations

from typing import Any

import pytest

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
