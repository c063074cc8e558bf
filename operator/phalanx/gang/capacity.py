"""What a node offers, what a pod asks for, and whether one can host the other.

This mirrors the kube-scheduler's filters that matter for gang admission (NodeResourcesFit,
NodeUnschedulable, TaintToleration, NodeAffinity) so that a gang the operator admits is a gang the
scheduler will bind. Resource amounts are int milli-units (see quantities.py); the pod count is the
pseudo-resource "pods", one pod being 1000.
"""

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, TypeVar, overload

from phalanx.gang.quantities import MILLI, QuantityError, format_milli, to_milli
from phalanx.pod_facts import TERMINAL_PHASES

ResourceList = Mapping[str, int]
"""Resource name -> amount in milli-units."""

Resources = tuple[tuple[str, int], ...]
"""A hashable, sorted ResourceList without zero entries."""

PODS: Final = "pods"
ONE_POD: Final = 1 * MILLI
UNSCHEDULABLE_TAINT_KEY: Final = "node.kubernetes.io/unschedulable"
# Taints the node lifecycle controller sets for conditions (not-ready, unreachable, pressure...).
CONDITION_TAINT_PREFIX: Final = "node.kubernetes.io/"
BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


def _resource_list(raw: Mapping[str, Any] | None) -> dict[str, int]:
    amounts: dict[str, int] = {}
    for name, quantity in (raw or {}).items():
        try:
            amounts[name] = to_milli(quantity)
        except QuantityError:
            # A malformed quantity would be rejected by the API server; treat it as absent.
            continue
    return amounts


def as_resources(amounts: Mapping[str, int]) -> Resources:
    return tuple(sorted((name, amount) for name, amount in amounts.items() if amount != 0))


def add_into(total: dict[str, int], amounts: Iterable[tuple[str, int]], times: int = 1) -> None:
    for name, amount in amounts:
        total[name] = total.get(name, 0) + amount * times


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    @classmethod
    def from_k8s(cls, taint: Mapping[str, Any]) -> "Taint":
        return cls(str(taint.get("key", "")), str(taint.get("value") or ""), str(taint.get("effect", "")))

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str
    # tolerationSeconds: a NoExecute taint tolerated this long only, then the pod is evicted.
    seconds: int | None = None

    @classmethod
    def from_k8s(cls, toleration: Mapping[str, Any]) -> "Toleration":
        seconds = toleration.get("tolerationSeconds")
        return cls(
            str(toleration.get("key") or ""),
            str(toleration.get("operator") or "Equal"),
            str(toleration.get("value") or ""),
            str(toleration.get("effect") or ""),
            int(seconds) if isinstance(seconds, int) else None,
        )

    def tolerates(self, taint: Taint) -> bool:
        """The Kubernetes rule: empty effect matches every effect, Exists with no key every key."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def tolerated_for(taint: Taint, tolerations: Iterable[Toleration]) -> float | None:
    """How long a pod with these tolerations stays on a node with this taint: None when it does not
    tolerate it at all, math.inf for good. For NoExecute, as the taint manager reads it: the first
    toleration that matches decides, its tolerationSeconds (0 at most: at once) or forever."""
    first = next((t for t in tolerations if t.tolerates(taint)), None)
    if first is None:
        return None
    if taint.effect != "NoExecute" or first.seconds is None:
        return math.inf
    return float(max(first.seconds, 0))


def blocking_taint(taint: Taint, tolerations: Iterable[Toleration]) -> str | None:
    """Why this taint keeps the pod off the node (None: it does not): untolerated, or an evicting
    taint tolerated for a while only (bound there, the pod would be evicted once it passes)."""
    if taint.effect not in BLOCKING_EFFECTS:
        return None
    stays = tolerated_for(taint, tolerations)
    if stays is None:
        return f"tainted {taint}"
    if math.isfinite(stays):
        return f"tainted {taint}, tolerated for {stays:.0f} s only"
    return None


@dataclass(frozen=True)
class Requirement:
    """One matchExpressions (or matchFields) entry of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...]

    @classmethod
    def from_k8s(cls, expression: Mapping[str, Any]) -> "Requirement":
        return cls(
            str(expression.get("key", "")),
            str(expression.get("operator", "")),
            tuple(str(value) for value in expression.get("values") or ()),
        )

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        match self.operator:
            case "In":
                return present and value in self.values
            case "NotIn":
                return not present or value not in self.values
            case "Exists":
                return present
            case "DoesNotExist":
                return not present
            case "Gt" | "Lt":
                if not present or len(self.values) != 1:
                    return False
                try:
                    actual, bound = int(value), int(self.values[0])
                except ValueError:
                    return False
                return actual > bound if self.operator == "Gt" else actual < bound
            case _:
                return False


@dataclass(frozen=True)
class NodeSelectorTerm:
    match_expressions: tuple[Requirement, ...]
    match_fields: tuple[Requirement, ...]

    @classmethod
    def from_k8s(cls, term: Mapping[str, Any]) -> "NodeSelectorTerm":
        return cls(
            tuple(Requirement.from_k8s(e) for e in term.get("matchExpressions") or ()),
            tuple(Requirement.from_k8s(e) for e in term.get("matchFields") or ()),
        )

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        # An empty term selects nothing, as in Kubernetes.
        if not self.match_expressions and not self.match_fields:
            return False
        fields = {"metadata.name": node_name}
        return all(r.matches(labels) for r in self.match_expressions) and all(
            r.matches(fields) for r in self.match_fields
        )


@dataclass(frozen=True)
class NodeInfo:
    name: str
    allocatable: Resources
    labels: Mapping[str, str] = field(default_factory=dict, hash=False, compare=True)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True

    @classmethod
    def from_k8s(cls, node: Mapping[str, Any]) -> "NodeInfo":
        metadata = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        # Allocatable is what the scheduler uses; capacity is the fallback for hand-written nodes.
        allocatable = _resource_list(status.get("allocatable") or status.get("capacity"))
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
        )
        return cls(
            name=str(metadata.get("name", "")),
            allocatable=as_resources(allocatable),
            labels={str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
            taints=tuple(Taint.from_k8s(t) for t in spec.get("taints") or ()),
            unschedulable=bool(spec.get("unschedulable", False)),
            ready=ready,
        )

    def allocatable_of(self, resource: str) -> int:
        return dict(self.allocatable).get(resource, 0)


def _node_facts(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What NodeInfo.from_k8s reads, for comparing two copies of a node (resourceVersion aside)."""
    return ((node.get("metadata") or {}).get("labels"), node.get("spec"), node.get("status"))


class NodeInfoCache:
    """NodeInfo per node, parsed again only when what it reads changed.

    Every node heartbeat stores a new copy whose capacity, labels and taints are the same; parsing
    hundreds of nodes for each admission decision was the operator's largest CPU cost.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[tuple[Any, ...], NodeInfo]] = {}
        self._last: NodeSet | None = None

    def infos(self, nodes: Iterable[Mapping[str, Any]]) -> list[NodeInfo]:
        fresh: dict[str, tuple[tuple[Any, ...], NodeInfo]] = {}
        for node in nodes:
            name = str((node.get("metadata") or {}).get("name", ""))
            facts = _node_facts(node)
            cached = self._by_name.get(name)
            # The same facts keep their NodeInfo, filed under the copy just read: the next compare
            # meets the very objects the store holds and ends at once.
            info = cached[1] if cached is not None and cached[0] == facts else NodeInfo.from_k8s(node)
            fresh[name] = (facts, info)
        self._by_name = fresh
        return [info for _, info in fresh.values()]

    def node_set(self, nodes: Iterable[Mapping[str, Any]]) -> "NodeSet":
        """The nodes as a NodeSet: the one returned last while no node's facts changed, so that
        what it derived from them (NodeSet.remember) serves the next decisions too."""
        infos = self.infos(nodes)
        last = self._last
        if (
            last is not None
            and len(last) == len(infos)
            and all(a is b for a, b in zip(last, infos, strict=True))
        ):
            return last
        self._last = NodeSet(infos)
        return self._last


@dataclass(frozen=True)
class PodDemand:
    """What one pod needs from a node: effective requests plus its placement constraints."""

    requests: Resources
    node_selector: tuple[tuple[str, str], ...] = ()
    # None: no required node affinity; otherwise the node must match at least one term.
    affinity_terms: tuple[NodeSelectorTerm, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()

    @classmethod
    def from_pod_spec(cls, spec: Mapping[str, Any]) -> "PodDemand":
        selector = spec.get("nodeSelector") or {}
        return cls(
            requests=as_resources(effective_requests(spec)),
            node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
            affinity_terms=_required_affinity_terms(spec),
            tolerations=tuple(Toleration.from_k8s(t) for t in spec.get("tolerations") or ()),
        )

    @property
    def placement_key(self) -> tuple[object, ...]:
        """Everything except the amounts: pods sharing it are eligible for the same nodes."""
        return (self.node_selector, self.affinity_terms, self.tolerations)

    def request_of(self, resource: str) -> int:
        return dict(self.requests).get(resource, 0)


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    requests = _resource_list(resources.get("requests"))
    # API defaulting: a resource with a limit and no request requests its limit (the only way
    # to ask for extended resources such as nvidia.com/gpu is often just a limit).
    for name, amount in _resource_list(resources.get("limits")).items():
        requests.setdefault(name, amount)
    return requests


def holds_extended(requests: ResourceList) -> bool:
    """Whether these requests hold an extended resource (an accelerator, say), by the scheduler's
    rule: a name with a domain outside kubernetes.io (hugepages-2Mi is native)."""
    return any(amount > 0 and is_extended_resource(name) for name, amount in requests.items())


def is_extended_resource(name: str) -> bool:
    """An extended resource (an accelerator, a MIG slice, RDMA), by the scheduler's rule: a name with
    a domain, not in kubernetes.io (cpu, memory, hugepages-2Mi are native)."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def effective_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """The pod's requests as the scheduler computes them, including the pod itself as one "pods".

    max(sum of app containers + all sidecars, each regular init container + the sidecars started
    before it), per resource, plus spec.overhead.
    """
    total: dict[str, int] = {}
    for container in spec.get("containers") or ():
        add_into(total, _container_requests(container).items())
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in spec.get("initContainers") or ():
        requests = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            add_into(sidecars, requests.items())
            continue
        running_now = dict(sidecars)
        add_into(running_now, requests.items())
        for name, amount in running_now.items():
            init_peak[name] = max(init_peak.get(name, 0), amount)
    add_into(total, sidecars.items())
    for name, amount in init_peak.items():
        total[name] = max(total.get(name, 0), amount)
    add_into(total, _resource_list(spec.get("overhead")).items())
    total[PODS] = ONE_POD
    return total


def _required_affinity_terms(spec: Mapping[str, Any]) -> tuple[NodeSelectorTerm, ...] | None:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    return tuple(NodeSelectorTerm.from_k8s(t) for t in required.get("nodeSelectorTerms") or ())


def is_bound_and_active(pod: Mapping[str, Any]) -> bool:
    """A pod that holds node resources: bound to a node and not finished (deleting ones still hold)."""
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    return bool(spec.get("nodeName")) and phase not in TERMINAL_PHASES


def node_held(pod: Mapping[str, Any], planned_node: str | None) -> str | None:
    """The node whose room the pod holds: where it is bound until it finishes, or, admitted and not
    bound yet, the node the admission plan chose for it (planned_node)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        return str(node) if is_bound_and_active(pod) else None
    if planned_node and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
        return planned_node
    return None


class RefusalKind(Enum):
    NOT_READY = "not ready"
    UNSCHEDULABLE = "cordoned"
    TAINT = "tainted"
    SELECTOR = "nodeSelector/affinity mismatch"
    INSUFFICIENT = "insufficient"
    RESERVED = "reserved"


@dataclass(frozen=True)
class Refusal:
    """Why one node cannot host one pod. For INSUFFICIENT, resource/free/allocatable are set."""

    kind: RefusalKind
    text: str = ""
    resource: str = ""
    free: int = 0
    allocatable: int = 0

    @property
    def detail(self) -> str:
        # Formatted on demand: a pass may build thousands of refusals and print a handful.
        if self.kind is RefusalKind.INSUFFICIENT:
            free = format_milli(self.resource, self.free)
            return f"{free}/{format_milli(self.resource, self.allocatable)} {self.resource} free"
        return self.text or self.kind.value


def placement_refusal(node: NodeInfo, demand: PodDemand) -> Refusal | None:
    """Refusals that do not depend on what runs on the node (readiness, taints, selectors)."""
    return _static_refusal(node, demand, transient_too=True)


def permanent_refusal(node: NodeInfo, demand: PodDemand) -> Refusal | None:
    """placement_refusal ignoring states a node recovers from: NotReady, cordoned, and the
    node.kubernetes.io/* condition taints. Used to tell "waits" from "can never fit"."""
    return _static_refusal(node, demand, transient_too=False)


def _static_refusal(node: NodeInfo, demand: PodDemand, transient_too: bool) -> Refusal | None:
    if transient_too and not node.ready:
        return Refusal(RefusalKind.NOT_READY, "not ready")
    if (
        transient_too
        and node.unschedulable
        and not any(t.tolerates(Taint(UNSCHEDULABLE_TAINT_KEY, "", "NoSchedule")) for t in demand.tolerations)
    ):
        return Refusal(RefusalKind.UNSCHEDULABLE, "cordoned")
    for taint in node.taints:
        if not transient_too and taint.key.startswith(CONDITION_TAINT_PREFIX):
            continue
        why = blocking_taint(taint, demand.tolerations)
        if why is not None:
            return Refusal(RefusalKind.TAINT, why)
    for key, value in demand.node_selector:
        if node.labels.get(key) != value:
            return Refusal(RefusalKind.SELECTOR, f"nodeSelector {key}={value} not matched")
    if demand.affinity_terms is not None and not any(
        term.matches(node.name, node.labels) for term in demand.affinity_terms
    ):
        return Refusal(RefusalKind.SELECTOR, "required node affinity not matched")
    return None


_T = TypeVar("_T")

# Entries a NodeSet keeps at most; beyond it, that kind starts over. Refusal tables hold an entry per
# node each (5,000 nodes x 4,096 placements would be millions): a few hundred placements; answers
# (never-fits reasons, one short text per gang shape) may be many more.
NODE_SET_TABLE_LIMIT: Final = 256
NODE_SET_MEMO_LIMIT: Final = 4096
_ABSENT: Final = object()


class NodeSet(Sequence[NodeInfo]):
    """The nodes at one moment, as admission reads them, and what admission derives from their facts
    alone: per pod shape, which nodes admit it; per gang shape, whether it could ever fit. Neither
    depends on what runs on the nodes, so NodeInfoCache.node_set hands the same NodeSet to every
    decision until a node changes, and each of those scans of every node runs once instead of once
    per decision (in a burst of new gangs they were the most of the operator's CPU).

    allocatable is shared by every decision that reads this set: never modified. A set may be read
    from several threads at once (preemption reads it outside the admission lock): a table or an
    answer two of them compute at the same time is computed twice, the same either way.
    """

    def __init__(self, infos: Iterable[NodeInfo]) -> None:
        self._infos = tuple(infos)
        self.by_name = {info.name: info for info in self._infos}
        self.order = sorted(self.by_name)
        self.allocatable = {info.name: dict(info.allocatable) for info in self._infos}
        self._refusals: dict[tuple[object, ...], tuple[list[str], dict[str, Refusal]]] = {}
        self._memo: dict[Hashable, Any] = {}

    @overload
    def __getitem__(self, index: int) -> NodeInfo: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[NodeInfo]: ...
    def __getitem__(self, index: int | slice) -> NodeInfo | Sequence[NodeInfo]:
        return self._infos[index]

    def __len__(self) -> int:
        return len(self._infos)

    def __iter__(self) -> Iterator[NodeInfo]:
        return iter(self._infos)

    def refusal_table(self, demand: PodDemand, ever: bool) -> tuple[list[str], dict[str, Refusal]]:
        """(nodes in name order that admit this pod shape, why each other one does not); ever: once
        nodes recover (permanent_refusal), otherwise now (placement_refusal). Callers do not
        modify what it returns."""
        key = (demand.placement_key, ever)
        table = self._refusals.get(key)
        if table is None:
            check = permanent_refusal if ever else placement_refusal
            eligible: list[str] = []
            refusals: dict[str, Refusal] = {}
            for name in self.order:
                refusal = check(self.by_name[name], demand)
                if refusal is None:
                    eligible.append(name)
                else:
                    refusals[name] = refusal
            if len(self._refusals) >= NODE_SET_TABLE_LIMIT:
                self._refusals = {}  # a new dict: a reader elsewhere keeps the one it holds
            table = self._refusals[key] = (eligible, refusals)
        return table

    def remember(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """compute(), kept under key for as long as this set lives: only for answers that depend on
        the nodes' facts and the key alone."""
        found = self._memo.get(key, _ABSENT)
        if found is not _ABSENT:
            return found  # type: ignore[no-any-return]
        if len(self._memo) >= NODE_SET_MEMO_LIMIT:
            self._memo = {}  # a new dict, not clear(): another thread may be reading this one
        value = self._memo[key] = compute()
        return value


def _resource_rank(name: str) -> tuple[int, str]:
    # Scarce accelerators first: they are what a person reading a reason cares about.
    if name == PODS:
        return (3, name)
    if name in ("cpu", "memory", "ephemeral-storage"):
        return (2, name)
    return (1, name)


def resource_refusal(node: NodeInfo, demand: PodDemand, used: ResourceList) -> Refusal | None:
    """The first resource (accelerators first) the node lacks for one more pod of this demand."""
    allocatable = dict(node.allocatable)
    free = {name: total - used.get(name, 0) for name, total in allocatable.items()}
    return shortage(free, allocatable, demand)


def shortage(free: Mapping[str, int], allocatable: Mapping[str, int], demand: PodDemand) -> Refusal | None:
    """Like resource_refusal, from precomputed free amounts (the admission pass keeps those)."""
    for name, amount in sorted(demand.requests, key=lambda item: _resource_rank(item[0])):
        room = max(free.get(name, 0), 0)
        if amount > room:
            total = allocatable.get(name, 0)
            return Refusal(RefusalKind.INSUFFICIENT, resource=name, free=min(room, total), allocatable=total)
    return None


def copies_that_fit(free: Mapping[str, int], requests: Resources) -> int:
    """How many pods with these requests fit into the free amounts (0 when any is short)."""
    copies: int | None = None
    for name, amount in requests:
        if amount <= 0:
            continue
        room = free.get(name, 0) // amount
        if room <= 0:
            return 0
        copies = room if copies is None else min(copies, room)
    # A pod requesting nothing at all (not even "pods") is unbounded; cap it at something sane.
    return copies if copies is not None else 1 << 30
