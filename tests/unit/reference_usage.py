"""The room pods hold per node, summed from scratch: the model that gang.usage.UsageIndex (kept up
to date event by event) and the slim cache are checked against. Only the tests need it."""

from collections.abc import Mapping, Sequence
from typing import Any

from phalanx.gang.admission import AdmissionPlan
from phalanx.gang.capacity import add_into, effective_requests, node_held


def usage_by_node(
    pods: Sequence[Mapping[str, Any]],
    admitted_unbound: Mapping[str, str] | None = None,
) -> dict[str, dict[str, int]]:
    """Requests held on each node by bound, non-terminal pods.

    admitted_unbound maps "namespace/name" of pods whose gates were lifted but which the scheduler has
    not bound yet to the node the admission plan chose; counting them stops the next pass from handing
    the same room to another gang.
    """
    planned = admitted_unbound or {}
    usage: dict[str, dict[str, int]] = {}
    for pod in pods:
        metadata = pod.get("metadata") or {}
        node = node_held(pod, planned.get(f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"))
        if node is not None:
            add_into(usage.setdefault(node, {}), effective_requests(pod.get("spec") or {}).items())
    return usage


def planned_nodes(plan: AdmissionPlan) -> dict[str, str]:
    """ "namespace/pod" -> node for every admitted pod: the admitted_unbound input of usage_by_node
    until the scheduler has bound those pods."""
    planned: dict[str, str] = {}
    for admission in plan.admitted:
        namespace = admission.key.split("/", 1)[0]
        for pod, node in admission.placements:
            planned[f"{namespace}/{pod}"] = node
    return planned
