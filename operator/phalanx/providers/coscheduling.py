"""coscheduling: the scheduler-plugins coscheduling plugin gangs the pods on a scheduling.x-k8s.io
PodGroup; the job's gang timeout becomes the PodGroup's scheduleTimeoutSeconds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from phalanx.api.v1alpha1 import TrainingJobSpec

SCHEDULER: Final = "scheduler-plugins-scheduler"
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"


@dataclass(frozen=True)
class Coscheduling:
    name: str = "coscheduling"
    admits_gangs: bool = False

    def shape_pod(self, pod_spec: dict[str, Any], labels: dict[str, str], annotations: dict[str, str],
                  group: str) -> None:  # fmt: skip
        pod_spec["schedulerName"] = SCHEDULER
        labels[POD_GROUP_LABEL] = group

    def podgroup(self, meta: dict[str, Any], spec: TrainingJobSpec,
                 min_resources: dict[str, str]) -> dict[str, Any] | None:  # fmt: skip
        cosched_spec: dict[str, Any] = {"minMember": spec.min_available}
        if spec.scheduling.gang.timeout_seconds > 0:  # 0: the scheduler's own default
            cosched_spec["scheduleTimeoutSeconds"] = spec.scheduling.gang.timeout_seconds
        if min_resources:
            cosched_spec["minResources"] = min_resources
        return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": meta,
                "spec": cosched_spec}  # fmt: skip


PROVIDER = Coscheduling()
