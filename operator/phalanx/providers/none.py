"""none: no gang scheduling; the default scheduler places the pods one by one (a gang may start in
part and wait for its peers' rendezvous)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.api.v1alpha1 import TrainingJobSpec


@dataclass(frozen=True)
class NoGang:
    name: str = "none"
    admits_gangs: bool = False

    def shape_pod(self, pod_spec: dict[str, Any], labels: dict[str, str], annotations: dict[str, str],
                  group: str) -> None:  # fmt: skip
        return None

    def podgroup(self, meta: dict[str, Any], spec: TrainingJobSpec,
                 min_resources: dict[str, str]) -> dict[str, Any] | None:  # fmt: skip
        return None


PROVIDER = NoGang()
