"""Scheduling providers: who gangs a TrainingJob's pods (spec.scheduling.provider). One interface,
one module per provider; everything else asks `provider_for(spec)` instead of comparing names.

- builtin.py: Phalanx admits whole gangs itself (a scheduling gate on every pod, the admission pass,
  admission at creation, the gang timeout; docs/scheduling.md).
- volcano.py, coscheduling.py: an external gang scheduler, fed a PodGroup; its queue and timeout rule.
- none.py: no gang scheduling at all; the default scheduler places pods one by one.
"""

from __future__ import annotations

from typing import Any, Protocol

from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.providers import builtin, coscheduling, none, volcano


class SchedulingProvider(Protocol):
    @property
    def name(self) -> str:
        """spec.scheduling.provider's value."""

    @property
    def admits_gangs(self) -> bool:
        """Phalanx itself admits the gang: pods are created gated and the admission pass lifts the
        gates; the gang timeout and preemption are Phalanx's. False: admitted once the pods exist."""

    def shape_pod(self, pod_spec: dict[str, Any], labels: dict[str, str], annotations: dict[str, str],
                  group: str) -> None:  # fmt: skip
        """Marks a worker pod for this provider (a gate, a schedulerName, the PodGroup it belongs to)."""

    def podgroup(self, meta: dict[str, Any], spec: TrainingJobSpec,
                 min_resources: dict[str, str]) -> dict[str, Any] | None:  # fmt: skip
        """The PodGroup this provider gangs on (metadata given); None when it needs none."""


PROVIDERS: dict[str, SchedulingProvider] = {
    p.name: p for p in (builtin.PROVIDER, volcano.PROVIDER, coscheduling.PROVIDER, none.PROVIDER)
}


def provider_named(name: str | None) -> SchedulingProvider:
    """The provider of that name ("builtin" when unset, as the CRD defaults it)."""
    try:
        return PROVIDERS[name or builtin.PROVIDER.name]
    except KeyError:
        raise ValueError(f"spec.scheduling.provider={name!r}: use one of {', '.join(PROVIDERS)}") from None


def provider_for(spec: TrainingJobSpec) -> SchedulingProvider:
    return provider_named(spec.scheduling.provider)


def provider_of_raw(spec: dict[str, Any]) -> SchedulingProvider:
    """For a job's spec as stored (a dict), without parsing the whole of it."""
    return provider_named((spec.get("scheduling") or {}).get("provider"))
