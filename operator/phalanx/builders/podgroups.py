"""PodGroups for external gang schedulers: the metadata here, the spec from the provider (providers/)."""

from __future__ import annotations

from typing import Any

from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.names import podgroup_name
from phalanx.builders.pods import JobRef, accelerator_limits, common_labels
from phalanx.providers import provider_for


def build_podgroup(job: JobRef, spec: TrainingJobSpec) -> dict[str, Any] | None:
    """The PodGroup the chosen scheduler gangs on; None for builtin and none."""
    meta = {
        "name": podgroup_name(job.name),
        "namespace": job.namespace,
        "labels": common_labels(job),
        "ownerReferences": [job.owner_reference()],
    }
    min_resources = {k: str(int(v) * spec.min_available) for k, v in accelerator_limits(spec).items()}
    return provider_for(spec).podgroup(meta, spec, min_resources)
