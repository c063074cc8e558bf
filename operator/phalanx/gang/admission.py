"""All-or-nothing admission of waiting gangs onto the cluster's free capacity.

One pass (plan_admission) walks the waiting gangs in order (priority desc, created asc, key) and
admits a gang only when at least min_available of its pods can be placed at the same time. When
the first gang that does not fit (the head) is blocked, it reserves the nodes it will need once the
work on them finishes; later gangs backfill only onto nodes outside that reservation, so they can
never delay the head. The reservation is sticky: pass last plan's reservations back in and the head
keeps its nodes instead of chasing whichever nodes look freest this time. docs/scheduling.md has
the full rule and why.
"""

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from phalanx.gang.capacity import (
    NodeInfo,
    NodeSet,
    PodDemand,
    Refusal,
    RefusalKind,
    ResourceList,
    Resources,
    add_into,
    copies_that_fit,
    shortage,
)
from phalanx.gang.early_start import EarlyStart
from phalanx.gang.explain import NodeOutlook, explain_never_fits, explain_waiting
from phalanx.gang.topology import TopologyRequest, closest_domains, place_with_topology


@dataclass(frozen=True)
class GangRequest:
    key: str  # "namespace/name"
    priority: int
    created: float
    pods: Sequence[tuple[str, PodDemand]]  # (pod name, demand), in rank order
    min_available: int = 0  # 0 means every pod
    topology: TopologyRequest | None = None  # spec.scheduling.topology (gang/topology.py)
    # How long the gang runs once started, as the job itself estimates it (None: no estimate). A
    # gang with one may backfill onto a blocked head's nodes when it ends before the head can start.
    estimate_seconds: float | None = None
    # Admitted when room exists, never waited for: it holds no nodes when blocked (warm spares,
    # gang/requests.py), so it never keeps another gang from backfilling.
    best_effort: bool = False
    # The highest spec.priority of its pods, as the scheduler compares it (None: as `priority`). It
    # can differ from `priority` (a default PriorityClass, a gang whose admission is being finished).
    pod_priority: int | None = None

    @property
    def scheduler_priority(self) -> int:
        """The priority the scheduler sees on its pods, which early start guards with
        (gang/early_start.py): a finishing gang's lifted `priority` is the operator's order only."""
        return self.priority if self.pod_priority is None else self.pod_priority

    @property
    def needed(self) -> int:
        return self.min_available if 0 < self.min_available <= len(self.pods) else len(self.pods)


@dataclass(frozen=True)
class Admission:
    key: str
    placements: tuple[tuple[str, str], ...]  # (pod name, node name)


@dataclass(frozen=True)
class AdmissionPlan:
    computed_at: float
    admitted: tuple[Admission, ...] = ()
    waiting: Mapping[str, str] = field(default_factory=dict)  # key -> why it waits
    never_fits: Mapping[str, str] = field(default_factory=dict)  # key -> why it cannot ever fit
    # key -> nodes held for that blocked gang; pass back into the next plan_admission call.
    reservations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # When a pass should look again, to start a blocked head early (gang/early_start.py); None: no need.
    recheck_at: float | None = None
    # Requests this plan admitted, per node (what the caller's `used` lacks until the pods are seen).
    placed: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def admission_order(gangs: Sequence[GangRequest]) -> list[GangRequest]:
    return sorted(gangs, key=lambda g: (-g.priority, g.created, g.key))


# A group is the pods of one gang that share an identical demand: (demand, pod names).
PodGroup = tuple[PodDemand, list[str]]


def group_pods(gang: GangRequest) -> list[PodGroup]:
    by_demand: dict[PodDemand, list[str]] = {}
    for name, demand in gang.pods:
        by_demand.setdefault(demand, []).append(name)
    # Largest pods first (accelerators, then cpu, then memory): they are the hardest to place.
    return sorted(by_demand.items(), key=lambda g: (_size_key(g[0]), g[1]), reverse=True)


def _size_key(demand: PodDemand) -> tuple[int, int, int]:
    requests = dict(demand.requests)
    extended = sum(v for k, v in requests.items() if k not in ("cpu", "memory", "ephemeral-storage", "pods"))
    return (extended, requests.get("cpu", 0), requests.get("memory", 0))


class ClusterState:
    """Free capacity during one pass, with per-shape eligibility cached (it cannot change mid-pass).

    version changes whenever free capacity or the reserved set changes, so results computed for
    one pod shape can be reused by the next gang of the same shape while nothing moved. Given a
    NodeSet (NodeInfoCache.node_set), what depends on the nodes' facts alone is shared with every
    pass and decision that reads the same set.
    """

    def __init__(self, nodes: Sequence[NodeInfo], used: Mapping[str, ResourceList]) -> None:
        self.node_set = nodes if isinstance(nodes, NodeSet) else NodeSet(nodes)
        self.nodes = self.node_set.by_name
        self.order = self.node_set.order
        self.allocatable = self.node_set.allocatable  # shared: read only
        self.free: dict[str, dict[str, int]] = {
            name: dict(amounts) for name, amounts in self.allocatable.items()
        }
        for node, amounts in used.items():
            free = self.free.get(node)
            if free is not None:
                for name, amount in amounts.items():
                    free[name] = free.get(name, 0) - amount
        self.reserved_by: dict[str, str] = {}
        self.version = 0
        # requests -> node -> copies_that_fit(free[node], requests); dropped per node on take().
        self._copies: dict[Resources, dict[str, int]] = {}

    def eligible(self, demand: PodDemand, ever: bool = False) -> list[str]:
        """Nodes whose readiness, taints and selectors admit this shape (ever: once nodes recover)."""
        return self.node_set.refusal_table(demand, ever)[0]

    def unreserved(self, demand: PodDemand) -> list[str]:
        return [n for n in self.eligible(demand) if n not in self.reserved_by]

    def copies(self, node: str, requests: Resources) -> int:
        table = self._copies.setdefault(requests, {})
        if node not in table:
            table[node] = copies_that_fit(self.free[node], requests)
        return table[node]

    def take(self, placements: Sequence[tuple[str, str]], demands: Mapping[str, PodDemand]) -> None:
        touched = set()
        for pod, node in placements:
            free = self.free[node]
            for name, amount in demands[pod].requests:
                free[name] = free.get(name, 0) - amount
            touched.add(node)
        for table in self._copies.values():
            for node in touched:
                table.pop(node, None)
        self.version += 1

    def reserve(self, key: str, nodes: Sequence[str]) -> None:
        for node in nodes:
            self.reserved_by[node] = key
        self.version += 1

    def outlooks(self, demand: PodDemand, ever: bool) -> list[NodeOutlook]:
        """Per node: how many pods of this shape fit (on allocatable when ever), or why none."""
        refusals = self.node_set.refusal_table(demand, ever)[1]
        free_by_node = self.allocatable if ever else self.free
        outlooks = []
        for node in self.order:
            refusal = refusals.get(node)
            if refusal is None and not ever and node in self.reserved_by:
                refusal = Refusal(RefusalKind.RESERVED)
            copies = 0
            if refusal is None:
                copies = copies_that_fit(free_by_node[node], demand.requests)
                if copies == 0:
                    refusal = shortage(free_by_node[node], self.allocatable[node], demand)
            outlooks.append(NodeOutlook(node, copies, refusal))
        return outlooks


def place_gang(
    groups: Sequence[PodGroup],
    needed: int,
    candidates: Mapping[PodDemand, Sequence[str]],
    free: Mapping[str, Mapping[str, int]],
    fixed_order: bool = False,
    copies_in_free: Callable[[str, Resources], int] | None = None,
) -> list[tuple[str, str]] | None:
    """Place as many pods as possible; None when fewer than needed fit. free is not modified.

    copies_in_free, when given, answers copies_that_fit(free[node], requests) from a cache.

    Default choice per step: if one node can take all remaining pods of a group, the tightest such
    node (keeps big holes for big gangs); otherwise the node taking the most (fewest nodes per gang,
    better for collectives). fixed_order=True fills nodes in the order given instead.
    """
    trial: dict[str, dict[str, int]] = {}
    placements: list[tuple[str, str]] = []
    for demand, names in groups:
        copies = {}
        for node in candidates[demand]:
            if node in trial or copies_in_free is None:
                fit = copies_that_fit(trial.get(node, free[node]), demand.requests)
            else:
                fit = copies_in_free(node, demand.requests)
            if fit > 0:
                copies[node] = fit
        remaining = list(names)
        order = list(candidates[demand])
        while remaining and copies:
            if fixed_order:
                node = next(n for n in order if n in copies)
            else:
                enough = [(fit, node) for node, fit in copies.items() if fit >= len(remaining)]
                if enough:
                    node = min(enough)[1]
                else:
                    node = min(copies.items(), key=lambda item: (-item[1], item[0]))[0]
            count = min(copies.pop(node), len(remaining))
            node_free = trial.setdefault(node, dict(free[node]))
            for name, amount in demand.requests:
                node_free[name] = node_free.get(name, 0) - amount * count
            placements.extend((pod, node) for pod in remaining[:count])
            del remaining[:count]
    return placements if len(placements) >= needed else None


def plan_admission(
    waiting: Sequence[GangRequest],
    nodes: Sequence[NodeInfo],
    used: Mapping[str, ResourceList],
    now: float,
    *,
    reservations: Mapping[str, Sequence[str]] | None = None,
    max_reservations: int = 1,
    free_at: Mapping[str, float] | None = None,
    early: Callable[[Sequence[str]], EarlyStart] | None = None,
    lowest_running_priority: int | None = None,
) -> AdmissionPlan:
    """Decide which waiting gangs to admit now and where each of their pods goes.

    used: requests already held per node (usage_by_node, including admitted pods not yet bound).
    now: stamped on the plan as computed_at (the admission time for the gang timeout).
    reservations: the previous plan's reservations, so a blocked head keeps the nodes it waits for.
    max_reservations: how many blocked gangs (in order) may hold nodes; 1 is EASY backfilling.
    free_at: when the work running on each node now ends (from the running jobs' ETAs; inf when some
    of it has none; a node absent runs nothing). With it, a gang that has an estimate may also use
    the free room of a blocked head's reserved nodes when it ends no later than the head can start
    (the latest free_at of those nodes): the head's start does not move, and GPUs that would idle
    while it waits train meanwhile (conservative backfilling, docs/scheduling.md).
    With free_at, a blocked head also trades reserved nodes whose room idles for busy ones whose
    work ends by its start anyway (_busy_instead_of_idle), leaving the idle room to the gangs behind.
    early: what early start knows of the nodes a blocked head holds (asked only then: it reads every
    pod on them); with it, a head whose nodes' work ends within the lead is admitted onto them at
    once, its pods left to the scheduler to bind as the work ends (gang/early_start.py).
    lowest_running_priority: the lowest priority preemption may stop below (None: nothing to stop):
    a head above it may preempt, so it keeps the idle room it holds (handed to a gang behind, the
    head would need one victim more, or stop the gang just admitted).
    """
    cluster = ClusterState(nodes, used)
    # Per node, what this pass admitted there: requests and the lowest pod priority (early start).
    placed: dict[str, tuple[dict[str, int], int]] = {}
    recheck: list[float] = []
    previous = reservations or {}
    admitted: list[Admission] = []
    waiting_reasons: dict[str, str] = {}
    never: dict[str, str] = {}
    held: dict[str, tuple[str, ...]] = {}
    # shape -> (cluster version, reason) of the last failed attempt: same shape, nothing moved, same answer.
    blocked_cache: dict[_Shape, tuple[int, str]] = {}

    for gang in admission_order(waiting):
        groups = group_pods(gang)
        if not groups:
            admitted.append(Admission(gang.key, ()))
            continue
        counts = [(demand, len(names)) for demand, names in groups]
        needed = gang.needed
        shape: _Shape = (
            tuple(counts),
            needed,
            gang.topology,
            gang.estimate_seconds if free_at is not None else None,
        )

        # Depends on the nodes' facts alone: kept with the NodeSet, for the passes and decisions after.
        never_reason = cluster.node_set.remember(
            ("never fits", tuple(counts), needed, gang.topology),
            partial(_never_fit_reason, cluster, groups, counts, needed, gang.topology),
        )
        if never_reason is not None:
            never[gang.key] = never_reason
            continue

        cached = blocked_cache.get(shape)
        if cached is not None and cached[0] == cluster.version and len(held) >= max_reservations:
            waiting_reasons[gang.key] = cached[1]
            continue

        candidates = {demand: cluster.unreserved(demand) for demand, _ in groups}
        placements = _place(gang, groups, needed, candidates, cluster)
        if placements is None and free_at is not None and gang.estimate_seconds is not None and held:
            ends = now + gang.estimate_seconds
            lendable = lendable_nodes(held, free_at, now, ends)
            if lendable:
                wider = {d: [n for n in cluster.eligible(d) if n not in cluster.reserved_by or n in lendable]
                         for d, _ in groups}  # fmt: skip
                placements = _place(gang, groups, needed, wider, cluster)
        if placements is not None:
            _admit(gang, groups, placements, cluster, admitted, placed)
            continue

        outlooks = cluster.outlooks(groups[0][0], ever=False)
        reason = explain_waiting(counts, needed, outlooks, cluster.reserved_by)
        if gang.topology is not None and gang.topology.required:
            reason = closest_domains(groups, candidates, cluster.free, cluster.nodes, gang.topology)
        waiting_reasons[gang.key] = reason
        blocked_cache[shape] = (cluster.version, reason)
        if len(held) < max_reservations and not gang.best_effort:
            nodes_held = _reserve(cluster, groups, needed, candidates, previous.get(gang.key), gang.topology)
            may_preempt = lowest_running_priority is not None and gang.priority > lowest_running_priority
            if free_at is not None and nodes_held and gang.topology is None and not may_preempt:
                known = _Ends(free_at, now, placed.keys())
                nodes_held = _busy_instead_of_idle(cluster, groups, needed, candidates, nodes_held, known)
            outlook = early(nodes_held) if nodes_held and early is not None else None
            if outlook is not None:
                room = outlook.room(nodes_held, cluster.allocatable, placed, gang.scheduler_priority, now)
                if room is not None:
                    on_held = {d: [n for n in cluster.eligible(d) if n in room] for d, _ in groups}
                    placements = _place_in(gang, groups, needed, on_held, room, cluster)
                    if placements is not None:
                        del waiting_reasons[gang.key]
                        _admit(gang, groups, placements, cluster, admitted, placed)
                        continue
                at = outlook.recheck_at(nodes_held, now)
                if at is not None:
                    recheck.append(at)
            if nodes_held:
                held[gang.key] = nodes_held
                cluster.reserve(gang.key, nodes_held)

    return AdmissionPlan(
        computed_at=now,
        admitted=tuple(admitted),
        waiting=waiting_reasons,
        never_fits=never,
        reservations=held,
        recheck_at=min(recheck, default=None),
        placed={node: requests for node, (requests, _) in placed.items()},
    )


def _admit(
    gang: GangRequest,
    groups: Sequence[PodGroup],
    placements: Sequence[tuple[str, str]],
    cluster: "ClusterState",
    admitted: list[Admission],
    placed: dict[str, tuple[dict[str, int], int]],
) -> None:
    demands = {pod: demand for demand, names in groups for pod in names}
    cluster.take(placements, demands)
    admitted.append(Admission(gang.key, tuple(placements)))
    priority = gang.scheduler_priority
    for pod, node in placements:
        requests, lowest = placed.get(node, ({}, priority))
        add_into(requests, demands[pod].requests)
        placed[node] = (requests, min(lowest, priority))


_Shape = tuple[tuple[tuple[PodDemand, int], ...], int, TopologyRequest | None, float | None]


def _place(
    gang: GangRequest,
    groups: Sequence[PodGroup],
    needed: int,
    candidates: Mapping[PodDemand, Sequence[str]],
    cluster: ClusterState,
) -> list[tuple[str, str]] | None:
    return _place_in(gang, groups, needed, candidates, cluster.free, cluster)


def _place_in(
    gang: GangRequest,
    groups: Sequence[PodGroup],
    needed: int,
    candidates: Mapping[PodDemand, Sequence[str]],
    free: Mapping[str, Mapping[str, int]],
    cluster: ClusterState,
) -> list[tuple[str, str]] | None:
    """Places the gang in `free` (the cluster's free room, or early start's room on held nodes)."""
    if gang.topology is None:
        cached = cluster.copies if free is cluster.free else None
        return place_gang(groups, needed, candidates, free, copies_in_free=cached)
    return place_with_topology(groups, needed, candidates, free, cluster.nodes, gang.topology, place_gang)


def head_start(nodes: Sequence[str], free_at: Mapping[str, float], now: float) -> float:
    """The earliest a blocked head can start on the nodes it holds: when the work on all of them
    has ended (inf when some of it has no estimate)."""
    return max((free_at.get(node, now) for node in nodes), default=now)


def lendable_nodes(
    held: Mapping[str, Sequence[str]], free_at: Mapping[str, float], now: float, ends: float
) -> set[str]:
    """Reserved nodes whose head cannot start before `ends`: a gang ending by then may use them. A
    head whose start is unknown (work without an end on one of its nodes) lends nothing: its start
    might be a minute away."""
    lent: set[str] = set()
    for nodes in held.values():
        start = head_start(nodes, free_at, now)
        if math.isfinite(start) and ends <= start:
            lent.update(nodes)
    return lent


def _never_fit_reason(
    cluster: ClusterState,
    groups: Sequence[PodGroup],
    counts: Sequence[tuple[PodDemand, int]],
    needed: int,
    topology: TopologyRequest | None = None,
) -> str | None:
    """None when the gang fits the cluster emptied of all work with every node recovered."""
    everywhere = {demand: cluster.eligible(demand, ever=True) for demand, _ in groups}
    if topology is None:
        if place_gang(groups, needed, everywhere, cluster.allocatable) is not None:
            return None
        return explain_never_fits(counts, needed, cluster.outlooks(groups[0][0], ever=True))
    fits = place_with_topology(
        groups, needed, everywhere, cluster.allocatable, cluster.nodes, topology, place_gang
    )
    if fits is not None:
        return None
    return (
        closest_domains(groups, everywhere, cluster.allocatable, cluster.nodes, topology)
        + " on an empty cluster"
    )


def _reserve(
    cluster: ClusterState,
    groups: Sequence[PodGroup],
    needed: int,
    candidates: Mapping[PodDemand, Sequence[str]],
    previous: Sequence[str] | None,
    topology: TopologyRequest | None = None,
) -> tuple[str, ...]:
    """The nodes a blocked gang will run on once the work on them finishes.

    Keep the previous reservation when it is still usable; otherwise fill the nodes where the most
    of the gang fits right now (they are likely to free up first), judged on allocatable. A gang
    with a topology holds the nodes of the domains it would take on allocatable.
    """
    if topology is not None:
        held = place_with_topology(
            groups, needed, candidates, cluster.allocatable, cluster.nodes, topology, place_gang
        )
        return tuple(sorted({node for _, node in held})) if held else ()
    if previous:
        kept = set(previous)
        available: set[str] = set().union(*candidates.values())
        if kept <= available:
            restricted = {demand: [n for n in nodes if n in kept] for demand, nodes in candidates.items()}
            placements = place_gang(groups, needed, restricted, cluster.allocatable, fixed_order=True)
            if placements is not None:
                return tuple(sorted({node for _, node in placements}))
    primary = groups[0][0]
    score = {node: _room_for(cluster.free[node], primary) for node in cluster.order}
    # Between nodes as full now, those holding more than they have last: a gang started early waits
    # there for the room (gang/early_start.py) and then stays for its whole run.
    overbooked = {node: any(amount < 0 for amount in cluster.free[node].values()) for node in cluster.order}
    ordered = {
        demand: sorted(nodes, key=lambda n: (-score[n], overbooked[n], n))
        for demand, nodes in candidates.items()
    }
    placements = place_gang(groups, needed, ordered, cluster.allocatable, fixed_order=True)
    if placements is None:
        return ()
    return tuple(sorted({node for _, node in placements}))


@dataclass(frozen=True)
class _Ends:
    """What the reservation reads of when nodes free: free_at, the pass's time, and the nodes this
    pass placed gangs on (they run from now, for as long as those gangs do: no known end)."""

    free_at: Mapping[str, float]
    now: float
    placed: Collection[str]

    def at(self, node: str) -> float:
        """When the node's work ends (now: nothing runs there; inf: not known)."""
        return math.inf if node in self.placed else self.free_at.get(node, self.now)


def _busy_instead_of_idle(
    cluster: ClusterState,
    groups: Sequence[PodGroup],
    needed: int,
    candidates: Mapping[PodDemand, Sequence[str]],
    held: tuple[str, ...],
    ends: _Ends,
) -> tuple[str, ...]:
    """A blocked head's nodes, trading a node whose room idles now for one whose work ends by the
    time the head can start anyway: the head starts no later, and the idle room is left to the gangs
    behind it, with or without estimates (EASY backfilling's extra nodes).

    Without this the head holds the emptiest nodes, which suits a head whose other nodes' work has no
    known end. A node takes their place only when free_at knows its end (its work is bound pods of
    jobs with an estimate), it ends by that start, nothing there is overbooked (a gang started
    early, waiting there for its whole run) and no gang took it in this pass. The trade is made on
    the estimates: an estimate that turns out short delays the head by the overrun, and with
    estimates that are upper bounds the head may start later than the idle node would have let it
    (still by the start they promised).
    """
    primary = groups[0][0]
    room = {node: _room_for(cluster.free[node], primary) for node in cluster.order}
    if all(room[node] == 0 for node in held):
        return held
    start = max(ends.at(node) for node in held)
    if not math.isfinite(start):
        return held

    def frees_by_start(node: str) -> bool:
        return ends.at(node) <= start and all(amount >= 0 for amount in cluster.free[node].values())

    # Busy nodes first, the fullest first, then the soonest free; idle ones only where it needs them.
    ordered = {
        demand: sorted((n for n in nodes if frees_by_start(n)), key=lambda n: (room[n], ends.at(n), n))
        for demand, nodes in candidates.items()
    }
    placements = place_gang(groups, needed, ordered, cluster.allocatable, fixed_order=True)
    if placements is None:
        return held
    return tuple(sorted({node for _, node in placements}))


def _room_for(free: Mapping[str, int], demand: PodDemand) -> float:
    """Pods of this shape the free amounts hold, fractions included (4 of 8 GPUs free is 0.5)."""
    ratios = [max(free.get(name, 0), 0) / amount for name, amount in demand.requests if amount > 0]
    return min(ratios, default=0.0)
