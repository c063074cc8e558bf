"""Which lower-priority running gangs to stop so that a blocked higher-priority gang fits.

Preemption goes through admission, not kube-scheduler: gated pods are invisible to the scheduler, so
its preemption never runs for a gang that waits at the gate. The operator stops whole victim gangs
(SIGTERM with their grace period, so they checkpoint and come back as a new attempt) and the head is
admitted on the next pass once their pods are gone. docs/scheduling.md has the rule.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from phalanx.gang.admission import ClusterState, GangRequest, group_pods, place_gang
from phalanx.gang.capacity import NodeInfo, PodDemand, ResourceList


@dataclass(frozen=True)
class RunningGang:
    key: str
    priority: int
    started: float
    pods: tuple[tuple[str, str, PodDemand], ...]  # (pod name, node name, demand)
    # A warm spare standing by (its one pod), not a gang: a waiting gang of its job's priority or
    # higher takes its room before any gang is stopped (a lower one would trade the job's recovery in
    # seconds for a preemption when it next loses a rank).
    idle_spare: bool = False


@dataclass(frozen=True)
class PreemptionChoice:
    victims: tuple[str, ...]  # keys of the gangs to stop, in the order they were chosen
    placements: tuple[tuple[str, str], ...]  # where the head fits once they are gone
    spares: tuple[tuple[str, str], ...] = ()  # (job key, pod name): idle spares to evict, not their jobs


def _release(free: dict[str, dict[str, int]], gang: RunningGang) -> None:
    for _, node, demand in gang.pods:
        if node in free:
            _add(free[node], demand.requests)


def _add(node_free: dict[str, int], amounts: Iterable[tuple[str, int]]) -> None:
    for name, amount in amounts:
        node_free[name] = node_free.get(name, 0) + amount


def choose_victims(
    head: GangRequest,
    running: Sequence[RunningGang],
    nodes: Sequence[NodeInfo],
    used: Mapping[str, ResourceList],
    freeing: Mapping[str, ResourceList] | None = None,
) -> PreemptionChoice | None:
    """The smallest set (greedy) of strictly lower-priority gangs whose removal lets the head fit.

    Idle warm spares of jobs of the head's priority or lower come first: taking one's room disturbs no
    training, and it stood by only on room no gang wanted. Then gangs, lowest priority first, then the most recently started (least
    work lost, even with checkpoints), then key. Victims are added until the head fits, then any victim the head turns out
    not to need is dropped again. None when the head fits already or even stopping every lower-priority
    gang would not make room.

    freeing: room per node (part of `used`) held by pods already being deleted, the victims of an
    earlier pass among them. Their grace period may last minutes, and the victim, restarting, is no
    longer a candidate: counted as free, so the head waits for them instead of stopping one more gang
    (None when that room is all the head needs). Running gangs must not list such pods themselves.
    """
    cluster = ClusterState(nodes, used)
    groups = group_pods(head)
    if not groups:
        return None
    candidates = {demand: cluster.eligible(demand) for demand, _ in groups}
    for node, amounts in (freeing or {}).items():
        if node in cluster.free:
            _add(cluster.free[node], amounts.items())
    if place_gang(groups, head.needed, candidates, cluster.free) is not None:
        return None
    lower = sorted(
        (
            gang
            for gang in running
            if gang.priority < head.priority or (gang.idle_spare and gang.priority <= head.priority)
        ),
        key=lambda gang: (not gang.idle_spare, gang.priority, -gang.started, gang.key, gang.pods[:1]),
    )

    def fits_without(victims: Sequence[RunningGang]) -> list[tuple[str, str]] | None:
        free = {node: dict(amounts) for node, amounts in cluster.free.items()}
        for victim in victims:
            _release(free, victim)
        return place_gang(groups, head.needed, candidates, free)

    if fits_without(lower) is None:
        return None  # not even every candidate gone makes room: one try, not one per candidate
    chosen: list[RunningGang] = []
    placements = None
    for victim in lower:
        chosen.append(victim)
        placements = fits_without(chosen)
        if placements is not None:
            break
    if placements is None:
        return None
    # Greedy order can over-select (an early victim may be on nodes the head ends up not using).
    for victim in list(reversed(chosen[:-1])):
        trimmed = [v for v in chosen if v is not victim]
        trial = fits_without(trimmed)
        if trial is not None:
            chosen, placements = trimmed, trial
    return PreemptionChoice(
        tuple(v.key for v in chosen if not v.idle_spare),
        tuple(placements),
        tuple((v.key, v.pods[0][0]) for v in chosen if v.idle_spare),
    )


def head_of_line_blocked(plan_waiting: Mapping[str, str], order: Sequence[GangRequest]) -> GangRequest | None:
    """The first gang in admission order that the plan left waiting (the candidate preemptor)."""
    return next((gang for gang in order if gang.key in plan_waiting), None)


def preemption_message(head_key: str, head_priority: int) -> str:
    """What the victim's condition and event say: who took its room, and at what priority."""
    return f"preempted by {head_key}, priority {head_priority}"
