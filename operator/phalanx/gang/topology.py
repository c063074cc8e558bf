"""Topology-aware placement of a gang (pure): spec.scheduling.topology.

Collectives are only as fast as the slowest link they cross: a ring all-reduce over two racks runs
at the speed of the uplink between them. A topology names a node label (a zone, a rack, an NVLink
domain such as nvidia.com/gpu.clique); nodes with the same value form one domain.

- Required: the gang (or, with groupSize, each run of groupSize consecutive ranks) lands within one
  domain, or waits, with a message naming the domains that come closest. Nodes without the label
  are not used.
- Preferred: one domain if any can take the gang whole; otherwise as few domains as possible, the
  roomiest first.

Ranks follow placement: pods are placed in rank order and the nodes domain by domain, so the ranks
of one domain are consecutive and a ring's neighbours share it. Among domains that fit, the tightest
is taken (it keeps the big domains for the big gangs), as gang/admission.place_gang does for nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from phalanx.gang.capacity import NodeInfo, PodDemand, Resources, copies_that_fit

PodGroup = tuple[PodDemand, list[str]]
Placer = Callable[..., list[tuple[str, str]] | None]


@dataclass(frozen=True)
class TopologyRequest:
    key: str  # the node label whose values are the domains
    required: bool
    group_size: int = 0  # 0: the whole gang is one group


def domains_of(nodes: Sequence[str], infos: Mapping[str, NodeInfo], key: str) -> dict[str, list[str]]:
    """Label value -> its nodes (in the given order); nodes without the label are left out."""
    domains: dict[str, list[str]] = {}
    for node in nodes:
        value = infos[node].labels.get(key)
        if value is not None:
            domains.setdefault(value, []).append(node)
    return domains


def _room(domain: Sequence[str], free: Mapping[str, Mapping[str, int]], requests: Resources) -> int:
    return sum(copies_that_fit(free[n], requests) for n in domain)


def place_with_topology(
    groups: Sequence[PodGroup],
    needed: int,
    candidates: Mapping[PodDemand, Sequence[str]],
    free: Mapping[str, Mapping[str, int]],
    infos: Mapping[str, NodeInfo],
    topology: TopologyRequest,
    place: Placer,
) -> list[tuple[str, str]] | None:
    """Like place_gang (`place`), within the topology's domains; None when it does not fit."""
    chunks = _chunks(groups, topology.group_size)
    trial: dict[str, dict[str, int]] = {node: dict(amounts) for node, amounts in free.items()}
    placements: list[tuple[str, str]] = []
    for chunk in chunks:
        placed = _place_chunk(chunk, candidates, trial, infos, topology, place)
        if placed is None:
            return None
        demands = {pod: demand for demand, names in chunk for pod in names}
        for pod, node in placed:
            for name, amount in demands[pod].requests:
                trial[node][name] = trial[node].get(name, 0) - amount
        placements.extend(placed)
    return placements if len(placements) >= needed else None


def _chunks(groups: Sequence[PodGroup], size: int) -> list[list[PodGroup]]:
    """The runs of consecutive ranks that must share a domain (the whole gang when size is 0)."""
    if size <= 0:
        return [list(groups)]
    return [[(demand, names[i : i + size])] for demand, names in groups for i in range(0, len(names), size)]


def _place_chunk(
    chunk: Sequence[PodGroup],
    candidates: Mapping[PodDemand, Sequence[str]],
    free: Mapping[str, Mapping[str, int]],
    infos: Mapping[str, NodeInfo],
    topology: TopologyRequest,
    place: Placer,
) -> list[tuple[str, str]] | None:
    count = sum(len(names) for _, names in chunk)
    demand = chunk[0][0]
    everywhere = sorted({n for d, _ in chunk for n in candidates[d]})
    domains = domains_of(everywhere, infos, topology.key)
    # One domain: the tightest that takes the chunk whole.
    for value in sorted(domains, key=lambda v: (_room(domains[v], free, demand.requests), v)):
        inside = set(domains[value])
        restricted = {d: [n for n in nodes if n in inside] for d, nodes in candidates.items()}
        placed = place(chunk, count, restricted, free)
        if placed is not None:
            return list(placed)
    if topology.required:
        return None
    # Preferred: as few domains as possible, the roomiest first, nodes domain by domain so that each
    # domain's ranks are consecutive; nodes without the label last.
    order = sorted(domains, key=lambda v: (-_room(domains[v], free, demand.requests), v))
    ranked = [n for v in order for n in domains[v]] + [
        n for n in everywhere if infos[n].labels.get(topology.key) is None
    ]
    position = {node: i for i, node in enumerate(ranked)}
    by_domain = {
        d: sorted(nodes, key=lambda n: position.get(n, len(position))) for d, nodes in candidates.items()
    }
    placed = place(chunk, count, by_domain, free, fixed_order=True)
    return list(placed) if placed is not None else None


def closest_domains(
    groups: Sequence[PodGroup],
    candidates: Mapping[PodDemand, Sequence[str]],
    free: Mapping[str, Mapping[str, int]],
    infos: Mapping[str, NodeInfo],
    topology: TopologyRequest,
) -> str:
    """Why a Required gang waits: how many of its pods (or of one group) each domain could take."""
    demand = groups[0][0]
    total = sum(len(names) for _, names in groups)
    size = topology.group_size if 0 < topology.group_size < total else total
    nodes = sorted({n for d, _ in groups for n in candidates[d]})
    domains = domains_of(nodes, infos, topology.key)
    if not domains:
        return f"no node with the label {topology.key} can take these pods (spec.scheduling.topology)"
    rooms = sorted(
        ((_room(domains[v], free, demand.requests), v) for v in domains), key=lambda r: (-r[0], r[1])
    )
    best = ", ".join(f"{value} {min(room, size)}" for room, value in rooms[:3])
    what = f"a group of {size} pods" if size < total else f"all {total} pods"
    return (f"no {topology.key} domain has room for {what} (spec.scheduling.topology Required); "
            f"closest: {best}")  # fmt: skip
