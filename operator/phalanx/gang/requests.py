"""From a job and its pods to what the gang planners take (pure): the request of a gang waiting at
the gate (gang/admission.py) and the running gang a preemption may stop (gang/preemption.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.gang.admission import GangRequest
from phalanx.gang.backfill import estimate_seconds
from phalanx.gang.capacity import PodDemand
from phalanx.gang.preemption import RunningGang
from phalanx.gang.topology import TopologyRequest
from phalanx.pod_facts import (
    attempt_sizes,
    attempt_spec,
    gang_order,
    in_current_attempt,
    is_deleting,
    is_gated,
    is_spare,
    is_terminal,
)

# Order value for a gang whose admission was interrupted: ahead of every PriorityClass (max 1e9).
FINISH_ADMISSION_PRIORITY: Final = 2**40
# Order value of a request made only of warm spares: behind every PriorityClass (min -2e9).
SPARES_PRIORITY: Final = -(2**40)


@dataclass(frozen=True)
class WaitingGang:
    request: GangRequest
    gated: dict[str, dict[str, Any]]  # pod name -> pod, the pods still at the gate
    finishing: bool  # its interrupted admission is being completed (it must not preempt)
    spares_only: bool = False  # warm spares only, best effort: no preemption, no admission message


PriorityOf = Callable[[TrainingJobSpec], int]
"""The value of the job's PriorityClass (as the admission pass last read them)."""


def waiting_gang(
    key: str, job: dict[str, Any], own_pods: list[dict[str, Any]], priority_of: PriorityOf, created: float
) -> WaitingGang | None:
    """The gang's request for its gated pods; None while it is being created or torn down (never
    admit half a gang) or when none of its pods waits."""
    status = job.get("status") or {}
    current = [p for p in own_pods if in_current_attempt(p, status)]
    if len(attempt_sizes(current, status)) > 1:
        return None  # built for two sizes: the reconcile restarts it (rules/elastic.py), never admitted
    # An elastic gang's own size, from its pods' label: the status may not hold it yet.
    spec = attempt_spec(parse(TrainingJobSpec, job["spec"]), status, current)
    priority = priority_of(spec)
    workers = [p for p in current if is_gated(p)]
    if len(current) < spec.replicas:
        return None
    if not workers:
        return _spares_request(key, own_pods, status, created)
    min_available = spec.min_available
    finishing = False
    ungated = len(current) - len(workers)
    if ungated:
        # Some gates are already lifted: an operator stopped in the middle of admitting this gang,
        # or pods beyond minAvailable wait for room. Place the rest; a gang below its minimum goes
        # first, since its admitted pods already hold their nodes.
        min_available = max(spec.min_available - ungated, 1)
        if ungated < spec.min_available:
            priority = FINISH_ADMISSION_PRIORITY
            finishing = True
    request = GangRequest(
        key=key,
        priority=priority,
        created=created,
        # In rank order: with a topology, the ranks of one domain come out consecutive.
        pods=tuple(
            (p["metadata"]["name"], PodDemand.from_pod_spec(p["spec"]))
            for p in sorted(workers, key=gang_order)
        ),
        min_available=min_available,
        topology=topology_request(spec),
        estimate_seconds=estimate_seconds(spec, job.get("status") or {}),
        pod_priority=max(
            (p["spec"]["priority"] for p in workers if isinstance(p["spec"].get("priority"), int)),
            default=None,
        ),
    )
    return WaitingGang(request, {p["metadata"]["name"]: p for p in workers}, finishing)


def _spares_request(
    key: str, own_pods: list[dict[str, Any]], status: dict[str, Any], created: float
) -> WaitingGang | None:
    """Warm spares (spec.spares) at the gate once the workers are admitted: best effort. Each is
    admitted when room exists (any number of them), after every gang (the lowest priority), and
    such a request never holds nodes nor preempts (gang/admission.py, controller/admission_pass.py):
    a spare never keeps a gang from its room."""
    gated = [
        p
        for p in own_pods
        if is_spare(p) and is_gated(p) and not in_current_attempt(p, status) and not is_deleting(p)
        and not is_terminal(p)
    ]  # fmt: skip
    if not gated:
        return None
    request = GangRequest(
        key=key,
        priority=SPARES_PRIORITY,
        created=created,
        pods=tuple(
            (p["metadata"]["name"], PodDemand.from_pod_spec(p["spec"])) for p in sorted(gated, key=gang_order)
        ),
        min_available=1,
        best_effort=True,
    )
    return WaitingGang(request, {p["metadata"]["name"]: p for p in gated}, finishing=False, spares_only=True)


def topology_request(spec: TrainingJobSpec) -> TopologyRequest | None:
    topology = spec.scheduling.topology
    if topology is None:
        return None
    return TopologyRequest(topology.key, topology.mode == "Required", topology.group_size or 0)


def running_gang(
    key: str, job: dict[str, Any], own_pods: list[dict[str, Any]], priority_of: PriorityOf, started: float
) -> RunningGang | None:
    """A gang a preemption could stop: Running or Admitted, with pods of its attempt bound and not
    being deleted (those count as room being freed already, not as room a victim would free)."""
    status = job.get("status") or {}
    if status.get("phase") not in ("Running", "Admitted"):
        return None
    # Its spares standing by are victims of their own (idle_spares); one told a rank is a worker.
    bound = [_bound(p) for p in own_pods if in_current_attempt(p, status) and _holds_room(p)]
    if not bound:
        return None
    return RunningGang(key, priority_of(parse(TrainingJobSpec, job["spec"])), started, tuple(bound))


def idle_spares(
    key: str, job: dict[str, Any], own_pods: list[dict[str, Any]], priority_of: PriorityOf, started: float
) -> list[RunningGang]:
    """The job's warm spares standing by on a node, each a victim of its own that a waiting gang of
    the job's priority or higher may take before a gang is stopped (gang/preemption.py): not one told to take a rank
    (a kept pod of the in-place attempt, in_current_attempt), not one already going."""
    status = job.get("status") or {}
    if status.get("phase") not in ("Running", "Admitted", "Restarting"):
        return []
    spares = [p for p in own_pods if is_spare(p) and not in_current_attempt(p, status) and _holds_room(p)]
    if not spares:
        return []
    priority = priority_of(parse(TrainingJobSpec, job["spec"]))
    return [RunningGang(key, priority, started, (_bound(p),), idle_spare=True) for p in spares]


def _holds_room(pod: dict[str, Any]) -> bool:
    """Bound and not going: a pod being deleted counts as room being freed already, and an ended
    pod holds none."""
    return bool(pod.get("spec", {}).get("nodeName")) and not is_deleting(pod) and not is_terminal(pod)


def _bound(pod: dict[str, Any]) -> tuple[str, str, PodDemand]:
    return pod["metadata"]["name"], pod["spec"]["nodeName"], PodDemand.from_pod_spec(pod["spec"])
