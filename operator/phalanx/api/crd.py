"""The TrainingJob CustomResourceDefinition, generated from the models in v1alpha1.py."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from phalanx import constants as c
from phalanx.api.schema import model_schema
from phalanx.api.v1alpha1 import TrainingJob

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.readySummary", "description": "Ready pods / replicas"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.currentReplicas",
     "description": "The gang's size in the current attempt (elastic jobs resize)"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts.failures",
     "description": "Gang restarts after failures"},
    {"name": "Preempted", "type": "integer", "jsonPath": ".status.restarts.preemptions",
     "description": "Gang restarts after preemption"},
    {"name": "Spares", "type": "string", "jsonPath": ".status.spares.summary", "priority": 1,
     "description": "Idle spares ready / spec.spares"},
    {"name": "Progress", "type": "integer", "jsonPath": ".status.progress.percent",
     "description": "Training progress in percent"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step", "priority": 1},
    {"name": "Checkpoint", "type": "integer", "jsonPath": ".status.lastCheckpoint.step", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]  # fmt: skip


def openapi_v3_schema() -> dict[str, Any]:
    schema = model_schema(TrainingJob)
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def schema_digest(crd_spec: Mapping[str, Any]) -> str:
    """A short digest of a CRD spec as generated: equal digests, equal schemas."""
    canonical = json.dumps(crd_spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def installed_digest(installed: Mapping[str, Any] | None) -> str:
    """The schema digest an installed CRD carries; "absent" without one (or without a CRD)."""
    annotations = ((installed or {}).get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(c.ANNOTATION_SCHEMA_DIGEST) or "absent")


def expected_digest() -> str:
    return schema_digest(build_crd()["spec"])


def stale_crd_message(installed: Mapping[str, Any] | None, expected: str) -> str | None:
    """Why the installed TrainingJob CRD is not the one this operator was built with (None: it is).
    An older schema makes the API server drop the status fields it does not know, silently, so the
    operator's bookkeeping of newer features is lost on every write. expected: expected_digest()
    (it builds the whole CRD: once per start)."""
    if installed is None:
        return f"the CustomResourceDefinition {c.CRD_NAME} is not installed: kubectl apply --server-side -f crds/"
    found = installed_digest(installed)
    if found == expected:
        return None
    return (
        f"the installed CustomResourceDefinition {c.CRD_NAME} is not this operator's (schema digest "
        f"{found}, expected {expected}): `helm upgrade` does not update CRDs, and the API server "
        "drops the status fields an older schema lacks. Apply the chart's CRDs: kubectl apply --server-side "
        "-f charts/phalanx/crds/"
    )


def build_crd() -> dict[str, Any]:
    crd = _crd_without_digest()
    crd["metadata"]["annotations"] = {c.ANNOTATION_SCHEMA_DIGEST: schema_digest(crd["spec"])}
    return crd


def _crd_without_digest() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": c.CRD_NAME,
            "labels": {"app.kubernetes.io/part-of": "phalanx"},
        },
        "spec": {
            "group": c.GROUP,
            "names": {
                "kind": c.KIND,
                "listKind": f"{c.KIND}List",
                "plural": c.PLURAL,
                "singular": c.SINGULAR,
                "shortNames": list(c.SHORT_NAMES),
                "categories": ["all", "phalanx"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": c.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_v3_schema()},
                }
            ],
        },
    }
