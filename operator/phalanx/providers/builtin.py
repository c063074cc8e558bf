"""builtin: Phalanx admits whole gangs. Every pod is created behind the gang scheduling gate, which
only the admission pass (or admission at creation) lifts, all of a gang's pods together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx import constants as c
from phalanx.api.v1alpha1 import TrainingJobSpec


@dataclass(frozen=True)
class Builtin:
    name: str = "builtin"
    admits_gangs: bool = True

    def shape_pod(self, pod_spec: dict[str, Any], labels: dict[str, str], annotations: dict[str, str],
                  group: str) -> None:  # fmt: skip
        pod_spec["schedulingGates"] = [
            *(pod_spec.get("schedulingGates") or []),
            {"name": c.GANG_SCHEDULING_GATE},
        ]

    def podgroup(self, meta: dict[str, Any], spec: TrainingJobSpec,
                 min_resources: dict[str, str]) -> dict[str, Any] | None:  # fmt: skip
        return None


PROVIDER = Builtin()
