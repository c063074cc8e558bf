"""The TrainingJob CustomResourceDefinition, generated from the models in v1alpha1.py."""

from __future__ import annotations

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


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{c.PLURAL}.{c.GROUP}",
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
