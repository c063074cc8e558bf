"""Priority preemption through admission: the fewest lower-priority gangs that make room."""

from __future__ import annotations

import pytest

from phalanx.gang.admission import GangRequest
from phalanx.gang.capacity import NodeInfo, PodDemand
from phalanx.gang.preemption import RunningGang, choose_victims

pytestmark = pytest.mark.unit

GPU = "nvidia.com/gpu"


def node(name: str) -> NodeInfo:
    return NodeInfo.from_k8s(
        {
            "metadata": {"name": name},
            "status": {
                "allocatable": {"cpu": "64", "pods": "110", GPU: "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def pod(gpus: int) -> PodDemand:
    return PodDemand.from_pod_spec({"containers": [{"name": "t", "resources": {"limits": {GPU: str(gpus)}}}]})


def head(pods: int, gpus: int, priority: int = 100) -> GangRequest:
    return GangRequest("ns/head", priority, 0.0, tuple((f"head-{i}", pod(gpus)) for i in range(pods)))


def running(key: str, priority: int, started: float, *placements: tuple[str, int]) -> RunningGang:
    return RunningGang(
        key, priority, started, tuple((f"{key}-{i}", n, pod(g)) for i, (n, g) in enumerate(placements))
    )


def usage(*gangs: RunningGang) -> dict[str, dict[str, int]]:
    used: dict[str, dict[str, int]] = {}
    for gang in gangs:
        for _, node_name, demand in gang.pods:
            for name, amount in demand.requests:
                used.setdefault(node_name, {}).setdefault(name, 0)
                used[node_name][name] += amount
    return used


NODES = [node("a"), node("b")]


def test_the_low_priority_job_on_the_needed_node_is_the_victim() -> None:
    low = running("ns/low", 0, 10.0, ("a", 8))
    choice = choose_victims(head(1, 8), [low], NODES[:1], usage(low))
    assert choice is not None
    assert choice.victims == ("ns/low",)
    assert choice.placements == (("head-0", "a"),)


def test_equal_or_higher_priority_is_never_preempted() -> None:
    same = running("ns/same", 100, 10.0, ("a", 8))
    higher = running("ns/higher", 200, 10.0, ("b", 8))
    assert choose_victims(head(2, 8), [same, higher], NODES, usage(same, higher)) is None


def test_no_preemption_when_the_head_fits_already() -> None:
    low = running("ns/low", 0, 10.0, ("a", 8))
    assert choose_victims(head(1, 8), [low], NODES, usage(low)) is None


def test_lowest_priority_then_newest_goes_first_and_unneeded_victims_are_spared() -> None:
    old = running("ns/old", 0, 1.0, ("a", 8))
    new = running("ns/new", 0, 5.0, ("b", 8))
    mid = running("ns/mid", 50, 5.0, ("a", 0))
    choice = choose_victims(head(1, 8), [old, new, mid], NODES, usage(old, new, mid))
    assert choice is not None and choice.victims == ("ns/new",)


def test_greedy_over_selection_is_trimmed() -> None:
    # The newest low-priority gang holds only half of node a; the head needs a whole node, so the
    # first pick alone does not help; the gang filling b does, and then the first pick is not needed.
    half = running("ns/half", 0, 9.0, ("a", 4))
    other_half = running("ns/other-half", 10, 8.0, ("a", 4))
    full = running("ns/full", 0, 1.0, ("b", 8))
    gangs = [half, other_half, full]
    choice = choose_victims(head(1, 8), gangs, NODES, usage(*gangs))
    assert choice is not None and choice.victims == ("ns/full",)


def test_none_when_even_all_victims_are_not_enough() -> None:
    low = running("ns/low", 0, 10.0, ("a", 8))
    assert choose_victims(head(3, 8), [low], NODES, usage(low)) is None


def test_room_that_terminating_victims_will_free_counts_so_no_second_victim_is_chosen() -> None:
    """Issue 12 B1: a victim's pods stay Terminating for their grace period and still count as used,
    and the victim (now restarting) is no longer a candidate. The next pass must count the room they
    will free instead of stopping another gang for the same head."""
    three = [node("a"), node("b"), node("c")]
    a, b, c = (running(f"ns/{n}", 0, t, (n, 8)) for n, t in (("a", 30.0), ("b", 20.0), ("c", 10.0)))
    first = choose_victims(head(1, 8), [a, b, c], three, usage(a, b, c))
    assert first is not None and first.victims == ("ns/a",)
    # Next pass: a's pod is Terminating (still in `used`), a is no longer running.
    again = choose_victims(head(1, 8), [b, c], three, usage(a, b, c), freeing=usage(a))
    assert again is None
    # What the terminating pods free is counted, and only what is still missing is preempted for.
    more = choose_victims(head(2, 8), [b, c], three, usage(a, b, c), freeing=usage(a))
    assert more is not None and more.victims == ("ns/b",)
