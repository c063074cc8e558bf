"""The assigned ResourceFlavors on the gang's pods (pure): their nodeLabels as nodeSelector and their
tolerations, as Kueue's own job integrations inject them when they start an admitted job, and the
admission checks' podSetUpdates (labels, annotations, nodeSelector, tolerations; a provisioning
request's, say). Pods of a Kueue-admitted gang carry no gang gate: Kueue has admitted the gang, the
kube-scheduler places it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from phalanx import constants as c


@dataclass(frozen=True)
class FlavorPlacement:
    node_labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    labels: dict[str, str] = field(default_factory=dict)  # from admission checks' podSetUpdates
    annotations: dict[str, str] = field(default_factory=dict)


class PlacementUnavailable(LookupError):
    """The gate holds no placement (a flavor missing, or a conflict): no pod may be created."""


class FlavorConflict(ValueError):
    """Two assigned flavors ask for different values of one node label: no node can have both."""


def _merge(
    into: dict[str, str], more: dict[str, Any], what: str, source: str, sources: dict[str, str]
) -> None:
    for key, value in more.items():
        if into.get(key, value) != value:
            raise FlavorConflict(
                f"{sources[key]} and {source} assign {what} {key} both {into[key]!r} and {value!r}"
            )
        into[key] = str(value)
        sources.setdefault(key, source)


def placement_of(
    flavors: list[dict[str, Any]], pod_set_updates: tuple[dict[str, Any], ...] = ()
) -> FlavorPlacement:
    """The union of the ResourceFlavors' nodeLabels and tolerations and of the admission checks'
    podSetUpdates (each with the name of its check under "admissionCheck"). Two values for one key
    conflict, as in Kueue's own merge: no pod could honour both."""
    labels: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    pod_labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    sources: dict[str, dict[str, str]] = {"node label": {}, "label": {}, "annotation": {}}
    parts = [
        (f"ResourceFlavor {(f.get('metadata') or {}).get('name', '')}", f.get("spec") or {}) for f in flavors
    ]
    parts += [(f"admission check {u.get('admissionCheck', '')}", {
        "nodeLabels": u.get("nodeSelector"), "tolerations": u.get("tolerations"),
        "labels": u.get("labels"), "annotations": u.get("annotations")}) for u in pod_set_updates]  # fmt: skip
    for source, part in parts:
        _merge(labels, part.get("nodeLabels") or {}, "node label", source, sources["node label"])
        _merge(pod_labels, part.get("labels") or {}, "label", source, sources["label"])
        _merge(annotations, part.get("annotations") or {}, "annotation", source, sources["annotation"])
        for toleration in part.get("tolerations") or []:
            if toleration not in tolerations:
                tolerations.append(dict(toleration))
    return FlavorPlacement(labels, tuple(tolerations), pod_labels, annotations)


def placed_pod(pod: dict[str, Any], placement: FlavorPlacement) -> dict[str, Any]:
    """`pod` with the flavors' node labels in its nodeSelector and their tolerations, ungated.
    A label the template already selects with another value is the flavor's to decide: Kueue
    assigned the flavor matching the template, so a clash means the template changed since."""
    placed = copy.deepcopy(pod)
    meta = placed.setdefault("metadata", {})
    # The operator's own labels and annotations (job, attempt, index) stay as they are: it finds its
    # pods by them.
    if placement.labels:
        meta["labels"] = {**placement.labels, **(meta.get("labels") or {})}
    if placement.annotations:
        meta["annotations"] = {**placement.annotations, **(meta.get("annotations") or {})}
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
