"""volcano: the Volcano scheduler gangs the pods on a scheduling.volcano.sh PodGroup, with its queue
and the job's PriorityClass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from phalanx.api.v1alpha1 import TrainingJobSpec

SCHEDULER: Final = "volcano"
GROUP_ANNOTATION: Final = "scheduling.k8s.io/group-name"


@dataclass(frozen=True)
class Volcano:
    name: str = "volcano"
    admits_gangs: bool = False

    def shape_pod(self, pod_spec: dict[str, Any], labels: dict[str, str], annotations: dict[str, str],
                  group: str) -> None:  # fmt: skip
        pod_spec["schedulerName"] = SCHEDULER
        annotations[GROUP_ANNOTATION] = group

    def podgroup(self, meta: dict[str, Any], spec: TrainingJobSpec,
                 min_resources: dict[str, str]) -> dict[str, Any] | None:  # fmt: skip
        volcano_spec: dict[str, Any] = {"minMember": spec.min_available}
        if spec.scheduling.queue:
            volcano_spec["queue"] = spec.scheduling.queue
        if spec.scheduling.priority_class_name:
            volcano_spec["priorityClassName"] = spec.scheduling.priority_class_name
        if min_resources:
            volcano_spec["minResources"] = min_resources
        return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": meta,
                "spec": volcano_spec}  # fmt: skip


PROVIDER = Volcano()
