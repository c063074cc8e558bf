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


def spare(key: str, priority: int, node_name: str, gpus: int = 8) -> RunningGang:
    return RunningGang(key, priority, 5.0, ((f"{key}-spare", node_name, pod(gpus)),), idle_spare=True)


def test_an_idle_spare_is_evicted_instead_of_stopping_a_lower_priority_gang() -> None:
    low = running("ns/low", 0, 10.0, ("a", 8))
    its_spare = spare("ns/low", 0, "b")
    choice = choose_victims(head(1, 8), [low, its_spare], NODES, usage(low, its_spare))
    assert choice is not None
    assert choice.victims == (), "no gang is stopped when a spare's room is enough"
    assert choice.spares == (("ns/low", "ns/low-spare"),)
    assert choice.placements == (("head-0", "b"),)


def test_an_equal_priority_head_takes_an_idle_spares_room_and_a_lower_one_does_not() -> None:
    # Before: an equal-priority head had no victim and waited as long as the spare stood by. A lower
    # one must not: the spare's job would trade a recovery in seconds for a preemption later.
    same = running("ns/same", 500, 10.0, ("a", 8))
    its_spare = spare("ns/same", 500, "b")
    choice = choose_victims(head(1, 8, priority=500), [same, its_spare], NODES, usage(same, its_spare))
    assert choice is not None and choice.victims == () and choice.spares == (("ns/same", "ns/same-spare"),)
    assert choose_victims(head(1, 8, priority=0), [same, its_spare], NODES, usage(same, its_spare)) is None


def test_spares_first_then_gangs_and_no_spare_that_the_head_does_not_need() -> None:
    # The head needs two whole nodes: mid's idle spare on b frees one; of the gangs, the lowest
    # priority (low, on a) frees the other, not mid (on c).
    three = [node("a"), node("b"), node("c")]
    low = running("ns/low", 0, 10.0, ("a", 8))
    spare_b = spare("ns/mid", 50, "b")
    mid = running("ns/mid", 50, 10.0, ("c", 8))
    choice = choose_victims(head(2, 8), [low, spare_b, mid], three, usage(low, spare_b, mid))
    assert choice is not None
    assert choice.spares == (("ns/mid", "ns/mid-spare"),)
    assert choice.victims == ("ns/low",), "the spare first, then the lowest-priority gang, not mid"


def test_an_unneeded_spare_chosen_early_is_dropped_again() -> None:
    # A spare on a 4-GPU-free node cannot make room for an 8-GPU pod alone; once the low gang is
    # chosen, the spare is not needed and stays.
    low = running("ns/low", 0, 10.0, ("a", 8))
    small = spare("ns/other", 0, "b", gpus=4)
    filler = running("ns/keep", 900, 10.0, ("b", 4))
    choice = choose_victims(head(1, 8), [low, small, filler], NODES, usage(low, small, filler))
    assert choice is not None and choice.victims == ("ns/low",) and choice.spares == ()
