"""PodGroups for external gang schedulers (Volcano, scheduler-plugins coscheduling)."""

from __future__ import annotations

from typing import Any

from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.names import podgroup_name
from phalanx.builders.pods import JobRef, accelerator_limits, common_labels


def build_podgroup(job: JobRef, spec: TrainingJobSpec) -> dict[str, Any] | None:
    """The PodGroup the chosen scheduler gangs on; None for builtin and none."""
    provider = spec.scheduling.provider
    meta = {
        "name": podgroup_name(job.name),
        "namespace": job.namespace,
        "labels": common_labels(job),
        "ownerReferences": [job.owner_reference()],
    }
    min_member = spec.min_available
    min_resources = {k: str(int(v) * min_member) for k, v in accelerator_limits(spec).items()}
    if provider == "volcano":
        volcano_spec: dict[str, Any] = {"minMember": min_member}
        if spec.scheduling.queue:
            volcano_spec["queue"] = spec.scheduling.queue
        if spec.scheduling.priority_class_name:
            volcano_spec["priorityClassName"] = spec.scheduling.priority_class_name
        if min_resources:
            volcano_spec["minResources"] = min_resources
        return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": meta,
                "spec": volcano_spec}  # fmt: skip
    if provider == "coscheduling":
        cosched_spec: dict[str, Any] = {"minMember": min_member}
        if spec.scheduling.gang.timeout_seconds > 0:  # 0: the scheduler's own default
            cosched_spec["scheduleTimeoutSeconds"] = spec.scheduling.gang.timeout_seconds
        if min_resources:
            cosched_spec["minResources"] = min_resources
        return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": meta,
                "spec": cosched_spec}  # fmt: skip
    return None
