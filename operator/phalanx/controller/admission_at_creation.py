"""Admission at creation (I/O side; the rule is gang/on_creation.py): a new gang that fits while
nothing waits is created admitted, pinned and without the gate, saving one write per pod."""

from __future__ import annotations

from typing import Any

from phalanx import metrics
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.pods import admitted_pod
from phalanx.controller.admission_state import AdmissionState
from phalanx.controller.stores import ClusterStores
from phalanx.gang.admission import GangRequest, plan_admission
from phalanx.gang.capacity import PodDemand
from phalanx.gang.on_creation import plan_on_creation
from phalanx.gang.requests import topology_request
from phalanx.pod_facts import pod_index
from phalanx.policy.elastic import Room
from phalanx.providers import provider_for


class CreationAdmission:
    def __init__(self, stores: ClusterStores, state: AdmissionState, enabled: bool = True) -> None:
        self.stores = stores
        self.state = state
        self.enabled = enabled  # off: every pod is created gated, even when nothing waits

    def admit(
        self, key: str, spec: TrainingJobSpec, pods: list[dict[str, Any]], now: float
    ) -> list[dict[str, Any]]:
        """Admits a new gang as its pods are created when nothing waits and the whole gang fits now.

        The pods are then created pinned and without the gate; the plan is the one the admission
        pass would make a moment later. With any gang waiting (a gated pod exists), every pod is
        created gated and the pass decides in order, so no one jumps the queue. Call release() once
        the creates have answered.
        """
        if not provider_for(spec).admits_gangs or not self.enabled:
            return pods
        state = self.state
        with state.lock:
            if not self.stores.synced():
                return pods  # not listed yet: the admission pass decides
            request = GangRequest(
                key=key,
                priority=state.priority_of(spec),
                created=now,
                pods=tuple(
                    (p["metadata"]["name"], PodDemand.from_pod_spec(p["spec"]))
                    for p in sorted(pods, key=pod_index)
                ),
                min_available=spec.min_available,
                topology=topology_request(spec),
            )
            nodes = state.node_infos.infos(self.stores.nodes.items())
            queued = bool(state.reservations) or self.stores.usage.anyone_waits()
            used = state.used_with_assumed(self.stores.usage)
            placements = plan_on_creation(request, nodes, used, queued, now)
            if placements is None:
                return pods
            namespace = key.split("/", 1)[0]
            demands = dict(request.pods)
            for name, node in placements.items():
                state.assumed[f"{namespace}/{name}"] = (node, demands[name].requests)
        metrics.observe_gang_admitted(namespace, key.split("/", 1)[1], 0.0)
        return [
            admitted_pod(p, placements[p["metadata"]["name"]]) if p["metadata"]["name"] in placements else p
            for p in pods
        ]

    def room_for(self, key: str, pod_spec: dict[str, Any], most: int, now: float) -> Room | None:
        """How many more pods like this one (up to `most`) fit now, as the admission pass would place
        them, off the nodes another blocked gang holds reserved; None before the stores are listed.
        For an elastic gang's size (policy/elastic.py): what it holds stays counted as used."""
        if most <= 0:
            return Room(0)
        state = self.state
        with state.lock:
            if not self.stores.synced():
                return None
            demand = PodDemand.from_pod_spec(pod_spec)
            probe = GangRequest(key=key, priority=0, created=now,
                                pods=tuple((f"room-{i}", demand) for i in range(most)), min_available=1)  # fmt: skip
            reserved = {n for k, nodes in state.reservations.items() if k != key for n in nodes}
            nodes = [n for n in state.node_infos.infos(self.stores.nodes.items()) if n.name not in reserved]
            plan = plan_admission([probe], nodes, state.used_with_assumed(self.stores.usage), now)
        return Room(len(plan.admitted[0].placements) if plan.admitted else 0)

    def release(self, namespace: str, pods: list[dict[str, Any]]) -> None:
        """The creates answered (the pod store holds what was created): nothing assumed is left."""
        with self.state.lock:
            for pod in pods:
                self.state.assumed.pop(f"{namespace}/{pod['metadata']['name']}", None)
