"""Topology-aware placement (gang/topology.py through gang/admission.plan_admission)."""

from __future__ import annotations

import pytest

from phalanx.gang.admission import plan_admission
from phalanx.gang.topology import TopologyRequest
from tests.unit.test_gang_admission import gang, gpu_node

pytestmark = pytest.mark.unit

RACK = "example.com/rack"


def racks(*sizes: int) -> list:  # type: ignore[type-arg]
    """Rack r-<i> with sizes[i] nodes of 8 GPUs each."""
    return [
        gpu_node(f"r{r}-n{n}", labels={RACK: f"r{r}"}) for r, size in enumerate(sizes) for n in range(size)
    ]


def placement_of(plan, key: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    (admission,) = [a for a in plan.admitted if a.key == key]
    return dict(admission.placements)


def rack_of(node: str) -> str:
    return node.split("-")[0]


def test_required_keeps_the_gang_in_one_rack_the_tightest_that_fits() -> None:
    # Racks of 4, 3 and 2 nodes; a 3-pod gang of whole nodes fits r0 or r1: r1 is tighter.
    nodes = racks(4, 3, 2)
    plan = plan_admission([gang("a", 3, 8, topology=TopologyRequest(RACK, required=True))], nodes, {}, 0.0)
    placed = placement_of(plan, "a")
    assert {rack_of(n) for n in placed.values()} == {"r1"}


def test_required_waits_when_no_rack_fits_and_says_which_came_closest() -> None:
    # r0 could hold the gang, but one of its 3 nodes is busy: the gang waits (it does not spread).
    nodes = racks(3, 2, 1)
    used = {"r0-n0": {"nvidia.com/gpu": 8}}
    plan = plan_admission([gang("a", 3, 8, topology=TopologyRequest(RACK, required=True))], nodes, used, 0.0)
    assert not plan.admitted and "a" not in plan.never_fits
    why = plan.waiting["a"]
    assert (
        "no example.com/rack domain has room for all 3 pods" in why and "closest: r0 2, r1 2, r2 1" in why
    ), why


def test_a_gang_no_rack_could_ever_hold_never_fits_with_the_reason() -> None:
    plan = plan_admission(
        [gang("a", 4, 8, topology=TopologyRequest(RACK, required=True))], racks(3, 3), {}, 0.0
    )
    assert "a" in plan.never_fits and "on an empty cluster" in plan.never_fits["a"]


def test_without_a_topology_the_same_gang_spans_racks() -> None:
    plan = plan_admission([gang("a", 4, 8)], racks(3, 3), {}, 0.0)
    assert len({rack_of(n) for n in placement_of(plan, "a").values()}) == 2


def test_preferred_spans_the_fewest_racks_with_consecutive_ranks_per_rack() -> None:
    # 5 whole-node pods over racks of 3, 1 and 2 nodes: 2 racks are needed, r0 and r2 (the roomiest).
    nodes = racks(3, 1, 2)
    plan = plan_admission([gang("a", 5, 8, topology=TopologyRequest(RACK, required=False))], nodes, {}, 0.0)
    placed = placement_of(plan, "a")
    by_rank = [rack_of(placed[f"a-{i}"]) for i in range(5)]
    assert by_rank == ["r0", "r0", "r0", "r2", "r2"]


def test_preferred_takes_one_rack_when_one_fits() -> None:
    plan = plan_admission(
        [gang("a", 2, 8, topology=TopologyRequest(RACK, required=False))], racks(3, 2), {}, 0.0
    )
    assert len({rack_of(n) for n in placement_of(plan, "a").values()}) == 1


def test_group_size_keeps_each_run_of_ranks_in_one_rack() -> None:
    # Groups of 2 consecutive ranks; racks of 2 nodes each: ranks 0-1, 2-3, 4-5 each share a rack.
    nodes = racks(2, 2, 2)
    plan = plan_admission(
        [gang("a", 6, 8, topology=TopologyRequest(RACK, required=True, group_size=2))], nodes, {}, 0.0
    )
    placed = placement_of(plan, "a")
    for first in (0, 2, 4):
        assert rack_of(placed[f"a-{first}"]) == rack_of(placed[f"a-{first + 1}"])
    assert len({rack_of(n) for n in placed.values()}) == 3


def test_nodes_without_the_label_are_not_used_by_a_required_gang() -> None:
    nodes = [*racks(1), gpu_node("unlabelled-0"), gpu_node("unlabelled-1")]
    plan = plan_admission([gang("a", 2, 8, topology=TopologyRequest(RACK, required=True))], nodes, {}, 0.0)
    assert not plan.admitted
