"""The assigned ResourceFlavors on the gang's pods (pure): their nodeLabels as nodeSelector and their
tolerations, as Kueue's own job integrations inject them when they start an admitted job. Pods of a
Kueue-admitted gang carry no gang gate: Kueue has admitted the gang, the kube-scheduler places it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from phalanx import constants as c


@dataclass(frozen=True)
class FlavorPlacement:
    node_labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()


class FlavorConflict(ValueError):
    """Two assigned flavors ask for different values of one node label: no node can have both."""


def placement_of(flavors: list[dict[str, Any]]) -> FlavorPlacement:
    """The union of the ResourceFlavors' nodeLabels and tolerations."""
    labels: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        for key, value in (spec.get("nodeLabels") or {}).items():
            if labels.get(key, value) != value:
                raise FlavorConflict(
                    f"ResourceFlavors assign node label {key} both {labels[key]!r} and {value!r}"
                )
            labels[key] = str(value)
        for toleration in spec.get("tolerations") or []:
            if toleration not in tolerations:
                tolerations.append(dict(toleration))
    return FlavorPlacement(labels, tuple(tolerations))


def placed_pod(pod: dict[str, Any], placement: FlavorPlacement) -> dict[str, Any]:
    """`pod` with the flavors' node labels in its nodeSelector and their tolerations, ungated.
    A label the template already selects with another value is the flavor's to decide: Kueue
    assigned the flavor matching the template, so a clash means the template changed since."""
    placed = copy.deepcopy(pod)
    spec = placed["spec"]
    if placement.node_labels:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **placement.node_labels}
    tolerations = spec.get("tolerations") or []
    for toleration in placement.tolerations:
        if toleration not in tolerations:
            tolerations.append(dict(toleration))
    if tolerations:
        spec["tolerations"] = tolerations
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != c.GANG_SCHEDULING_GATE]
    if gates:
        spec["schedulingGates"] = gates
    else:
        spec.pop("schedulingGates", None)
    return placed
