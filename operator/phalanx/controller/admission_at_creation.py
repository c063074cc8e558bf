"""Admission at creation (I/O side; the rule is gang/on_creation.py): a new gang that fits while
nothing waits is created admitted, pinned and without the gate, saving one write per pod."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Final

from phalanx import metrics
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.pods import admitted_pod
from phalanx.controller.admission_state import AdmissionState, Claim
from phalanx.controller.stores import ClusterStores
from phalanx.gang.admission import GangRequest, plan_admission
from phalanx.gang.capacity import NodeInfo, PodDemand
from phalanx.gang.on_creation import plan_on_creation
from phalanx.gang.requests import topology_request
from phalanx.pod_facts import gang_order, is_spare
from phalanx.policy.elastic import Room
from phalanx.providers import provider_for

# A claimed pod the store does not hold yet is on its way (its create sent); after this long it is not
# (refused, or deleted). A provisional hold a decision never settled lasts as long. A grow's claim is
# not timed: it ends with its attempt (Claim.grown_attempt).
CLAIM_SECONDS: Final = 60.0


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
                # The workers only: warm spares are best effort, left to the admission pass
                # (gang/requests.py), and never keep the workers from being admitted.
                pods=tuple(
                    (p["metadata"]["name"], PodDemand.from_pod_spec(p["spec"]))
                    for p in sorted(pods, key=gang_order)
                    if not is_spare(p)
                ),
                min_available=spec.min_available,
                topology=topology_request(spec),
            )
            nodes = state.node_infos.node_set(self.stores.nodes.items())
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

    def room_for(
        self, key: str, pod_spec: dict[str, Any], most: int, now: float, hold: bool = False
    ) -> Room | None:
        """How many more pods like this one (up to `most`) fit now, as the admission pass would place
        them, off the nodes another blocked gang holds reserved and after the room other elastic
        gangs were sized or grown into and have not placed yet (their claims); None before the
        stores are listed. For an elastic gang's size (policy/elastic.py): what it holds stays counted
        as used. hold: the room found is claimed for this gang at once, under the same lock, so that
        a decision made meanwhile for another gang cannot be given it too; settle() says what became
        of it."""
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
            every_node = state.node_infos.node_set(self.stores.nodes.items())
            # The shared set (what it derived serves this probe too) unless some nodes are held.
            nodes: Sequence[NodeInfo] = (
                [n for n in every_node if n.name not in reserved] if reserved else every_node
            )
            used = state.used_with_assumed(self.stores.usage)
            # The claims go first (a higher priority than the probe's): their room is not free.
            plan = plan_admission(
                [*self._claimed(now, besides=key), probe], nodes, used, now, max_reservations=0
            )
            room = Room(next((len(a.placements) for a in plan.admitted if a.key == key), 0))
            held = state.claims.get(key)
            # A decided claim (a grow waiting for its old pods to go, say) stays: the hold is only
            # for a decision not made yet, and settle() would drop it with the hold.
            if hold and room.pods and (held is None or held.provisional):
                state.claims[key] = Claim(demand, room.pods, room.pods, frozenset(), now, provisional=True)
        return room

    def claim(
        self,
        key: str,
        pod_spec: dict[str, Any],
        pods: int,
        needed: int,
        names: Iterable[str],
        now: float,
        grown_attempt: int | None = None,
        holding: Iterable[str] = (),
    ) -> None:
        """The gang decided on room: a new attempt of `pods` pods (`names`, being created), or a
        restart to grow to `pods` (as attempt `grown_attempt`), `needed` of them beyond what its old
        pods (`holding`) hold. Held until placed (a grow: until its attempt's pods are created)."""
        claim = Claim(PodDemand.from_pod_spec(pod_spec), pods, needed, frozenset(names), now,
                      grown_attempt=grown_attempt, holding=frozenset(holding))  # fmt: skip
        with self.state.lock:
            self.state.claims[key] = claim

    def unclaim(self, key: str, names: Iterable[str]) -> None:
        """These pods of the claim were not created (the API refused them, or another owner holds
        the name): no room is kept for them."""
        with self.state.lock:
            held = self.state.claims.get(key)
            if held is not None and held.names:
                left = held.names - frozenset(names)
                self.state.claims[key] = replace(held, names=left, pods=len(left), needed=len(left))

    def end_grow(self, key: str, attempt: int, active: bool) -> None:
        """The job is at `attempt` (active: not finished or suspended): a grow claim for another
        attempt, or of a job no longer active, ends (the pods it was for will not be created)."""
        with self.state.lock:
            held = self.state.claims.get(key)
            if (
                held is not None
                and held.grown_attempt is not None
                and (held.grown_attempt != attempt or not active)
            ):
                del self.state.claims[key]

    def settle(self, key: str, forget: bool = False) -> None:
        """The decision that read the room with hold=True is made and did not claim it: the hold goes
        (forget: the job is gone, its claim too)."""
        with self.state.lock:
            held = self.state.claims.get(key)
            if held is not None and (forget or held.provisional):
                del self.state.claims[key]

    def _claimed(self, now: float, besides: str) -> list[GangRequest]:
        """The other gangs' live claims as gangs to place before a probe; ended ones are dropped (the
        caller holds the lock)."""
        requests = []
        for key, held in list(self.state.claims.items()):
            pods, needed = held.pods, held.needed
            if held.names:
                absent, waiting = self.stores.usage.unplaced(held.names)
                on_the_way = (
                    {n for n in absent if n not in self.state.assumed}
                    if now - held.since < CLAIM_SECONDS
                    else set()
                )
                pods = needed = len(on_the_way | waiting)
            elif held.holding:
                gone, _ = self.stores.usage.unplaced(held.holding)
                pods = min(held.pods, held.needed + len(gone))
            elif held.provisional and now - held.since >= CLAIM_SECONDS:
                pods = 0
            if pods <= 0:
                del self.state.claims[key]
                continue
            if key == besides:
                continue
            requests.append(GangRequest(key=key, priority=1, created=held.since,
                                        pods=tuple((f"claimed-{i}", held.demand) for i in range(pods)),
                                        min_available=needed))  # fmt: skip
        return requests

    def release(self, namespace: str, pods: list[dict[str, Any]]) -> None:
        """The creates answered (the pod store holds what was created): nothing assumed is left."""
        with self.state.lock:
            for pod in pods:
                self.state.assumed.pop(f"{namespace}/{pod['metadata']['name']}", None)
