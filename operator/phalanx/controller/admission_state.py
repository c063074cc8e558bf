"""What admission at creation and the admission pass share, under one lock: one plan at a time.

assumed: pods admitted at creation whose create reply is still on its way ("namespace/name" ->
(node, requests)); reservations: nodes held for the head of the queue; priorities: PriorityClass
values as the last pass read them; node_infos: parsed nodes, re-parsed only when they change.
"""

from __future__ import annotations

import threading

from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.gang.capacity import NodeInfoCache, Resources
from phalanx.gang.usage import UsageIndex


class AdmissionState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.assumed: dict[str, tuple[str, Resources]] = {}
        self.reservations: dict[str, tuple[str, ...]] = {}
        self.priorities: dict[str, int] = {}  # PriorityClass name -> value, read by each admission pass
        self.node_infos = NodeInfoCache()  # read under the lock only

    def priority_of(self, spec: TrainingJobSpec) -> int:
        """The value of the job's PriorityClass as the last admission pass read it."""
        return self.priorities.get(spec.scheduling.priority_class_name or "", 0)

    def used_with_assumed(self, usage: UsageIndex) -> dict[str, dict[str, int]]:
        """Room held per node by bound and admitted pods, and by creates whose reply is on its way
        (the caller holds the lock, which guards self.assumed)."""
        return usage.used(self.assumed)
