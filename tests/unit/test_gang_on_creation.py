"""Admission at creation: a new gang skips the gate only when nothing waits and it fits whole."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.builders.pods import admitted_pod
from phalanx.cache import object_key
from phalanx.gang.admission import GangRequest
from phalanx.gang.capacity import NodeInfo, PodDemand, as_resources
from phalanx.gang.on_creation import Assumed, plan_on_creation
from phalanx.gang.usage import UsageIndex
from phalanx.pod_facts import planned_node

pytestmark = pytest.mark.unit

GPU = "nvidia.com/gpu"
GATE = [{"name": "phalanx.dev/gang"}]


def node(name: str, gpus: int = 8) -> NodeInfo:
    return NodeInfo(name, as_resources({GPU: gpus * 1000, "pods": 110_000, "cpu": 64_000}))


def pod(name: str, gpus: int, node_name: str = "", phase: str = "Pending", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": {GPU: str(gpus)}}}], **spec},
        "status": {"phase": phase},
    }


def request(pods: int, gpus: int) -> GangRequest:
    demand = PodDemand.from_pod_spec(pod("x", gpus)["spec"])
    return GangRequest("ns/new", 0, 0.0, tuple((f"new-worker-{i}", demand) for i in range(pods)))


def index_of(pods: list[dict[str, Any]]) -> UsageIndex:
    index = UsageIndex()
    index.reset({object_key(p): p for p in pods})
    return index


def plan_among(
    gang: GangRequest,
    nodes: list[NodeInfo],
    pods: list[dict[str, Any]],
    in_flight: Assumed,
    reservations: dict[str, tuple[str, ...]],
    now: float,
) -> dict[str, str] | None:
    """What the controller decides for a new gang with these pods in the cluster."""
    index = index_of(pods)
    queued = bool(reservations) or index.anyone_waits()
    return plan_on_creation(gang, nodes, index.used(in_flight), queued, now)


def test_a_gang_that_fits_with_nothing_waiting_is_placed_at_creation() -> None:
    placements = plan_among(request(2, 8), [node("a"), node("b")], [], {}, {}, now=1.0)
    assert placements is not None and sorted(placements.values()) == ["a", "b"]


def test_a_gated_pod_anywhere_sends_every_new_gang_through_the_queue() -> None:
    waiting = pod("other-worker-0", 8, schedulingGates=GATE)
    assert index_of([waiting]).anyone_waits()
    assert plan_among(request(1, 1), [node("a"), node("b")], [waiting], {}, {}, now=1.0) is None
    # ...unless that gated pod belongs to a finished attempt.
    done = pod("old-worker-0", 8, phase="Failed", schedulingGates=GATE)
    assert plan_among(request(1, 1), [node("a")], [done], {}, {}, now=1.0) is not None


def test_a_head_reservation_sends_new_gangs_through_the_queue() -> None:
    assert plan_among(request(1, 1), [node("a")], [], {}, {"ns/head": ("a",)}, now=1.0) is None


def test_a_gang_that_does_not_fit_whole_is_created_gated() -> None:
    running = pod("busy-worker-0", 8, node_name="a", phase="Running")
    assert plan_among(request(2, 8), [node("a"), node("b")], [running], {}, {}, now=1.0) is None


def test_pinned_and_in_flight_pods_hold_their_nodes() -> None:
    pinned = admitted_pod(pod("pinned-worker-0", 8, schedulingGates=GATE), "a")
    assert planned_node(pinned) == "a"
    # "a" is taken by a pinned pod, "b" by a create still in flight: no room for one more 8-GPU pod.
    in_flight = {"ns/flying-worker-0": ("b", as_resources({GPU: 8000, "pods": 1000}))}
    landed = admitted_pod(pod("flying-worker-0", 8, schedulingGates=GATE), "b")  # the reply came
    assert plan_among(request(1, 8), [node("a"), node("b")], [pinned], in_flight, {}, 1.0) is None
    placements = plan_among(request(1, 8), [node("a"), node("b"), node("c")], [pinned, landed],
                            in_flight, {}, 1.0)  # fmt: skip
    assert placements == {"new-worker-0": "c"}


def test_an_admitted_pod_is_pinned_and_keeps_other_gates() -> None:
    gated = pod(
        "w-0", 8, nodeSelector={"pool": "gpu"}, schedulingGates=[*GATE, {"name": "example.com/quota"}]
    )
    out = admitted_pod(gated, "node-7")
    # Pinned by the node's name (matchFields), not by its kubernetes.io/hostname label, which may differ.
    assert out["spec"]["nodeSelector"] == {"pool": "gpu"}
    pin = {"key": "metadata.name", "operator": "In", "values": ["node-7"]}
    assert out["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [pin]}]}
        }
    }
    assert planned_node(out) == "node-7" and planned_node(gated) is None
    assert out["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
    assert gated["spec"]["schedulingGates"] == [*GATE, {"name": "example.com/quota"}]  # input untouched
    assert "schedulingGates" not in admitted_pod(pod("w-1", 8, schedulingGates=GATE), "n")["spec"]


def test_pinning_narrows_every_required_term_of_the_template() -> None:
    """A gated pod's required node affinity may only narrow: the pin joins each of its terms."""
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]},
    ]
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    gated = pod("w-0", 8, schedulingGates=GATE, affinity=affinity)
    out = admitted_pod(gated, "n-3")
    pinned_terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    pin = {"key": "metadata.name", "operator": "In", "values": ["n-3"]}
    assert pinned_terms["nodeSelectorTerms"] == [{**t, "matchFields": [pin]} for t in terms]
    assert gated["spec"]["affinity"] == affinity and "matchFields" not in terms[0]  # input untouched
    labels = {"zone": "z2"}
    demand = PodDemand.from_pod_spec(out["spec"])
    assert demand.affinity_terms is not None
    assert any(t.matches("n-3", labels) for t in demand.affinity_terms)
    assert not any(t.matches("n-4", labels) for t in demand.affinity_terms)


def test_a_spare_waiting_at_the_gate_sends_no_new_gang_through_the_queue() -> None:
    # Spares are admitted after every gang (best effort): one that never finds room on a full
    # cluster must not turn admission at creation off for every new gang there.
    spare = pod("other-spare-0", 8, schedulingGates=GATE)
    spare["metadata"]["labels"] = {"phalanx.dev/job-name": "other", "phalanx.dev/spare": "true"}
    assert not index_of([spare]).anyone_waits()
    assert plan_among(request(1, 1), [node("a"), node("b")], [spare], {}, {}, now=1.0) is not None
