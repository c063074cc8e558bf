"""Admission at creation: when nothing waits and a new gang fits, admit it as its pods are created.

Creating the pods gated and lifting the gates a moment later costs one more API write per pod and
an admission pass of latency, for the same result. The rule keeps the queue fair: as soon as any
gang waits (a gated pod exists, or the head holds a reservation), every new gang is created gated
and the admission pass decides in order.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from phalanx.gang.admission import GangRequest, plan_admission
from phalanx.gang.capacity import NodeInfo, Resources, add_into
from phalanx.pod_facts import is_gated, is_spare, is_terminal

Assumed = Mapping[str, tuple[str, Resources]]
"""Pods admitted at creation whose create is still in flight: "namespace/name" -> (node, requests)."""


def add_in_flight(
    used: dict[str, dict[str, int]], assumed: Assumed, seen: Callable[[str], bool]
) -> dict[str, dict[str, int]]:
    """Adds the creates still in flight to `used`, except the pods already counted (seen)."""
    for key, (node, requests) in assumed.items():
        if not seen(key):
            add_into(used.setdefault(node, {}), requests)
    return used


def waits_for_admission(pod: Mapping[str, Any]) -> bool:
    """A gated pod that has not finished: some gang is queued. Not a warm spare: spares are admitted
    after every gang (best effort), so a new gang placed at creation jumps nobody, and a spare that
    finds no room on a full cluster would otherwise send every new gang through the queue."""
    return is_gated(pod) and not is_terminal(pod) and not is_spare(pod)


def plan_on_creation(
    request: GangRequest,
    nodes: Sequence[NodeInfo],
    used: dict[str, dict[str, int]],
    queued: bool,
    now: float,
) -> dict[str, str] | None:
    """Pod name -> node when the new gang may skip the gate; None when it must queue.

    used: room held per node, creates in flight included (gang.usage.UsageIndex.used); queued: some
    gang waits (a gated pod of an unfinished attempt exists, or the head holds a reservation).
    """
    if queued:
        return None
    plan = plan_admission([request], nodes, used, now)
    if not plan.admitted:
        return None
    return dict(plan.admitted[0].placements)
