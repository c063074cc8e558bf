"""Kubernetes' own schema for the types a TrainingJob embeds (the pod template), as a CRD schema.

The source is the Kubernetes OpenAPI of the version the project targets, in the JSON Schema form that
kubernetes-validate ships (pinned in requirements-dev.txt). Only `make crd` reads it: the generated
CRD is committed, and the operator never imports this module at run time.

A CRD schema must be structural (apiextensions.k8s.io/v1): no `$ref`, one type per node, no
`additionalProperties: false`, int-or-string spelled `x-kubernetes-int-or-string`. Embedded object
metadata keeps labels and annotations only, as for every pod template inside another object. List
and patch extensions are left out: an embedded template is replaced whole, never merged.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

KUBERNETES_VERSION = "1.36.0"
_SCHEMA_DIR = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict"
_PREFIX = "#/$defs/"
_INT_OR_STRING = (
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
)
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
# Extensions that describe strategic-merge and server-side-apply merging; meaningless inside an
# embedded template and, for list map keys, a structural rule (keys required or defaulted) to satisfy.
_DROPPED = frozenset(("$schema", "$id", "additionalProperties", "x-kubernetes-list-map-keys",
                      "x-kubernetes-list-type", "x-kubernetes-map-type", "x-kubernetes-patch-merge-key",
                      "x-kubernetes-patch-strategy", "x-kubernetes-unions"))  # fmt: skip


def embedded_metadata() -> dict[str, Any]:
    """Metadata of an embedded template: labels and annotations (the rest is set by the owner)."""
    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    return {
        "type": "object",
        "description": "Labels and annotations for the objects made from this template.",
        "properties": {
            "labels": {**string_map, "description": "Labels."},
            "annotations": {**string_map, "description": "Annotations."},
        },
    }


@functools.cache
def _definitions() -> dict[str, Any]:
    text = resources.files("kubernetes_validate").joinpath(_SCHEMA_DIR, "_definitions.json").read_text()
    definitions: dict[str, Any] = json.loads(text)["$defs"]
    return definitions


def kubernetes_schema(name: str) -> dict[str, Any]:
    """The structural schema of a Kubernetes type, for example "io.k8s.api.core.v1.PodSpec"."""
    return _structural(_definitions()[name], frozenset((name,)))


def _first_sentence(text: str) -> str:
    """Kubernetes' descriptions run to paragraphs; the first sentence keeps `kubectl explain` useful
    and the CRD a fraction of the size."""
    head = text.split(". ", 1)[0].strip()
    return head if head.endswith(".") else head + "."


def _structural(node: dict[str, Any], seen: frozenset[str]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is not None:
        name = ref.removeprefix(_PREFIX)
        if name in _INT_OR_STRING:
            schema: dict[str, Any] = {"anyOf": [{"type": "integer"}, {"type": "string"}],
                                      "x-kubernetes-int-or-string": True}  # fmt: skip
        elif name == _OBJECT_META:
            schema = embedded_metadata()
        elif name in seen:
            raise ValueError(f"recursive Kubernetes type {name}: cannot be inlined into a CRD")
        else:
            schema = _structural(_definitions()[name], seen | {name})
        if "description" in node:
            schema["description"] = _first_sentence(node["description"])
        return schema
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED and not (key == "additionalProperties" and isinstance(value, dict)):
            continue
        if key == "type":
            types = [t for t in (value if isinstance(value, list) else [value]) if t != "null"]
            (out["type"],) = types
        elif key == "description":
            out["description"] = _first_sentence(value)
        elif key == "properties":
            out["properties"] = {k: _structural(v, seen) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _structural(value, seen)
        elif key == "enum":
            out["enum"] = [v for v in value if v is not None]
        else:
            out[key] = value
    return out
