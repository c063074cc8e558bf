"""Why a gang waits, in one short sentence a person can act on.

Example: "needs 4 pods x 8 nvidia.com/gpu; only 2 nodes can host one (node-a: 2/8 nvidia.com/gpu free;
3 nodes tainted gpu=reserved:NoSchedule)". Messages stay under MAX_REASON_CHARS so they fit a
condition message and an event without being cut by a UI.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from phalanx.gang.capacity import PODS, PodDemand, Refusal, RefusalKind, is_extended_resource
from phalanx.gang.quantities import format_milli

MAX_REASON_CHARS: Final = 299
_MAX_DETAILS: Final = 3
_BASIC_RESOURCES: Final = ("cpu", "memory")


@dataclass(frozen=True)
class NodeOutlook:
    """One node seen from one pod shape: how many more such pods fit, or why none does."""

    node: str
    copies: int
    refusal: Refusal | None


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def describe_requests(demand: PodDemand) -> str:
    """ "8 nvidia.com/gpu" for accelerator pods, "4 cpu, 16Gi memory" for the rest."""
    requests = [(name, amount) for name, amount in demand.requests if name != PODS]
    extended = [(name, amount) for name, amount in requests if is_extended_resource(name)]
    shown = extended or [(name, amount) for name, amount in requests if name in _BASIC_RESOURCES]
    if not shown:
        return "no resources"
    return ", ".join(f"{format_milli(name, amount)} {name}" for name, amount in shown)


def describe_gang(groups: Sequence[tuple[PodDemand, int]], needed: int) -> str:
    """ "needs 4 pods x 8 nvidia.com/gpu"; groups are (demand, pod count) largest first."""
    if len(groups) == 1:
        return f"needs {_plural(needed, 'pod')} x {describe_requests(groups[0][0])}"
    parts = " + ".join(f"{count} x {describe_requests(demand)}" for demand, count in groups)
    return f"needs {needed} of {sum(count for _, count in groups)} pods ({parts})"


def _details(outlooks: Sequence[NodeOutlook], reserved_for: dict[str, str], ever: bool = False) -> list[str]:
    refused = [o for o in outlooks if o.copies == 0 and o.refusal is not None]
    details: list[tuple[int, str]] = []
    short = [o for o in refused if o.refusal is not None and o.refusal.kind is RefusalKind.INSUFFICIENT]
    if short:
        # Name the most promising short node: the one closest to having room.
        best = min(short, key=lambda o: (-(o.refusal.free if o.refusal else 0), o.node))
        refusal = best.refusal
        assert refusal is not None
        if ever:
            amount = format_milli(refusal.resource, refusal.allocatable)
            text = f"{best.node}: {amount} {refusal.resource} allocatable"
        else:
            text = f"{best.node}: {refusal.detail}"
        if len(short) > 1:
            text = f"{len(short)} nodes short, best {text}"
        details.append((len(short), text))
    by_other: Counter[str] = Counter()
    for outlook in refused:
        refusal = outlook.refusal
        if refusal is None or refusal.kind is RefusalKind.INSUFFICIENT:
            continue
        if refusal.kind is RefusalKind.RESERVED:
            by_other[f"reserved for {reserved_for.get(outlook.node, 'a gang ahead')}"] += 1
        elif refusal.kind is RefusalKind.SELECTOR:
            by_other["outside nodeSelector/affinity"] += 1
        else:
            by_other[refusal.detail] += 1
    for text, count in by_other.items():
        details.append((count, f"{_plural(count, 'node')} {text}"))
    details.sort(key=lambda item: (-item[0], item[1]))
    return [text for _, text in details[:_MAX_DETAILS]]


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def _capacity_clause(outlooks: Sequence[NodeOutlook], needed: int, ever: bool) -> str:
    hosts = [o for o in outlooks if o.copies > 0]
    room = sum(o.copies for o in hosts)
    if not hosts:
        return "no node can ever host one" if ever else "no node can host one now"
    if room >= needed:
        return f"room for {room} but not for the whole gang at once"
    nodes = _plural(len(hosts), "node")
    if room == len(hosts):
        return f"only {nodes} can {'ever ' if ever else ''}host one"
    return f"room for only {room} on {nodes}"


def explain_waiting(
    groups: Sequence[tuple[PodDemand, int]],
    needed: int,
    outlooks: Sequence[NodeOutlook],
    reserved_for: dict[str, str] | None = None,
) -> str:
    """Why the gang does not fit the free capacity now; outlooks are for its largest pod shape."""
    details = _details(outlooks, reserved_for or {})
    suffix = f" ({'; '.join(details)})" if details else ""
    return _clip(f"{describe_gang(groups, needed)}; {_capacity_clause(outlooks, needed, ever=False)}{suffix}")


def explain_never_fits(
    groups: Sequence[tuple[PodDemand, int]], needed: int, outlooks: Sequence[NodeOutlook]
) -> str:
    """Why the gang cannot fit even on an empty cluster; outlooks are computed on allocatable."""
    details = _details(outlooks, {}, ever=True)
    suffix = f" ({'; '.join(details)})" if details else ""
    clause = _capacity_clause(outlooks, needed, ever=True)
    if clause.startswith("room for") and not clause.startswith("room for only"):
        clause = "the pod shapes cannot be packed together"
    return _clip(f"{describe_gang(groups, needed)}; even an empty cluster fails: {clause}{suffix}")
