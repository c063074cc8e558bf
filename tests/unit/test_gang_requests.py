"""From a job and its pods to the planners' inputs (gang/requests.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.gang.requests import (
    FINISH_ADMISSION_PRIORITY,
    SPARES_PRIORITY,
    idle_spares,
    running_gang,
    waiting_gang,
)

pytestmark = pytest.mark.unit

GATE = [{"name": "phalanx.dev/gang"}]


def at(priority: int) -> Callable[[TrainingJobSpec], int]:
    return lambda spec: priority


def a_job(replicas: int = 2, min_available: int | None = None, **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": replicas, "template": {"spec": {"containers": [{"name": "trainer"}]}}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    return {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}, "spec": spec, "status": status}


def a_pod(
    index: int, gated: bool, attempt: int = 0, node: str = "", deleting: bool = False
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"j-worker-{index}", "labels": {"phalanx.dev/attempt": str(attempt)}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "trainer", "resources": {"requests": {"cpu": "1"}}}]}
    if gated:
        spec["schedulingGates"] = GATE
    if node:
        spec["nodeName"] = node
    return {"metadata": metadata, "spec": spec, "status": {}}


def test_a_whole_gated_gang_asks_for_every_pod_at_its_priority() -> None:
    waiting = waiting_gang("ns/j", a_job(), [a_pod(0, True), a_pod(1, True)], priority_of=at(7), created=5.0)
    assert waiting is not None and not waiting.finishing
    assert waiting.request.priority == 7 and waiting.request.created == 5.0
    assert [name for name, _ in waiting.request.pods] == ["j-worker-0", "j-worker-1"]
    assert waiting.request.min_available == 2 and set(waiting.gated) == {"j-worker-0", "j-worker-1"}


def test_half_a_gang_or_one_without_a_gated_pod_asks_for_nothing() -> None:
    assert waiting_gang("ns/j", a_job(), [a_pod(0, True)], priority_of=at(0), created=0.0) is None
    assert (
        waiting_gang("ns/j", a_job(), [a_pod(0, False), a_pod(1, False)], priority_of=at(0), created=0.0)
        is None
    )
    stale = [a_pod(0, True, attempt=1), a_pod(1, True, attempt=1)]
    assert waiting_gang("ns/j", a_job(), stale, priority_of=at(0), created=0.0) is None


def test_an_interrupted_admission_is_finished_first_and_asks_only_for_what_is_left() -> None:
    pods = [a_pod(0, False, node="n"), a_pod(1, True), a_pod(2, True)]
    waiting = waiting_gang("ns/j", a_job(replicas=3), pods, priority_of=at(7), created=0.0)
    assert waiting is not None and waiting.finishing
    assert waiting.request.priority == FINISH_ADMISSION_PRIORITY and waiting.request.min_available == 2


def test_with_one_gate_left_the_gang_asks_for_one_pod_ahead_of_every_priority() -> None:
    # minAvailable is every replica (api/v1alpha1.py): a gang with gates lifted is always unfinished.
    pods = [a_pod(0, False, node="n"), a_pod(1, False, node="n"), a_pod(2, True)]
    waiting = waiting_gang("ns/j", a_job(replicas=3, min_available=3), pods, priority_of=at(7), created=0.0)
    assert waiting is not None and waiting.finishing
    assert waiting.request.priority == FINISH_ADMISSION_PRIORITY and waiting.request.min_available == 1
    assert [name for name, _ in waiting.request.pods] == ["j-worker-2"]


def test_a_running_gang_offers_its_bound_pods_not_those_being_deleted() -> None:
    pods = [a_pod(0, False, node="n1"), a_pod(1, False, node="n2", deleting=True), a_pod(2, False)]
    gang = running_gang(
        "ns/j", a_job(replicas=3, phase="Running", attempt=0), pods, priority_of=at(3), started=9.0
    )
    assert gang is not None and (gang.key, gang.priority, gang.started) == ("ns/j", 3, 9.0)
    assert [(name, node) for name, node, _ in gang.pods] == [("j-worker-0", "n1")]


def test_only_running_or_admitted_gangs_with_bound_pods_can_be_stopped() -> None:
    bound = [a_pod(0, False, node="n1")]
    for phase in ("Pending", "Restarting", "Succeeded"):
        assert running_gang("ns/j", a_job(phase=phase), bound, priority_of=at(0), started=0.0) is None
    assert (
        running_gang("ns/j", a_job(phase="Admitted"), [a_pod(0, False)], priority_of=at(0), started=0.0)
        is None
    )


def test_an_in_place_attempt_asks_for_its_replacement_beside_the_pod_it_keeps() -> None:
    # Restart in place: worker-0 (attempt 0) is kept by attempt 1 and holds its node; only the
    # replacement worker-1 waits at the gate, and the gang finishes its admission first.
    kept = a_pod(0, False, attempt=0, node="n0")
    kept["metadata"]["uid"] = "k0"
    in_place = {"attempt": 1, "keptPods": [{"name": "j-worker-0", "uid": "k0"}]}
    job = a_job(attempt=1, inPlace=in_place, phase="Pending")
    waiting = waiting_gang("ns/j", job, [kept, a_pod(1, True, attempt=1)], priority_of=at(3), created=0.0)
    assert waiting is not None and set(waiting.gated) == {"j-worker-1"}
    assert waiting.finishing and waiting.request.priority == FINISH_ADMISSION_PRIORITY
    assert waiting.request.min_available == 1
    # Without status.inPlace the old pod is not the attempt's: half a gang asks for nothing.
    assert waiting_gang("ns/j", a_job(attempt=1), [kept, a_pod(1, True, attempt=1)], at(3), 0.0) is None
    running = running_gang(
        "ns/j", {**job, "status": {**job["status"], "phase": "Running"}}, [kept], at(3), 0.0
    )
    assert running is not None and [name for name, _, _ in running.pods] == ["j-worker-0"]


def elastic_job(max_replicas: int, **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"elastic": {"minReplicas": 1, "maxReplicas": max_replicas},
                            "template": {"spec": {"containers": [{"name": "trainer"}]}}}  # fmt: skip
    return {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}, "spec": spec, "status": status}


def sized_pod(index: int, size: int) -> dict[str, Any]:
    p = a_pod(index, True)
    p["metadata"]["labels"]["phalanx.dev/gang-size"] = str(size)
    return p


def test_an_elastic_gang_is_admitted_whole_at_the_size_its_pods_carry_not_a_stale_status() -> None:
    # Three gated pods built for size 3; the status still says 2 (its write lost or not seen yet).
    pods = [sized_pod(i, 3) for i in range(3)]
    waiting = waiting_gang("ns/j", elastic_job(4, currentReplicas=2), pods, priority_of=at(0), created=0.0)
    assert waiting is not None
    assert len(waiting.request.pods) == 3 and waiting.request.min_available == 3


def test_an_elastic_gang_whose_pods_disagree_on_the_size_is_not_admitted() -> None:
    pods = [sized_pod(0, 2), sized_pod(1, 3), sized_pod(2, 3)]
    assert (
        waiting_gang("ns/j", elastic_job(4, currentReplicas=3), pods, priority_of=at(0), created=0.0) is None
    )


def a_spare(number: int, gated: bool, node: str = "", deleting: bool = False) -> dict[str, Any]:
    spare = a_pod(0, gated, node=node, deleting=deleting)
    spare["metadata"]["name"] = f"j-spare-{number}"
    spare["metadata"]["labels"]["phalanx.dev/spare"] = "true"
    return spare


def spared(replicas: int = 2, spares: int = 1) -> dict[str, Any]:
    job = a_job(replicas)
    job["spec"].update(spares=spares, runPolicy={"restartStrategy": "InPlace"})
    return job


def test_a_new_gangs_workers_are_admitted_without_its_spares() -> None:
    # replicas + spares need not fit: the workers are the gang, the spares wait behind them.
    pods = [a_spare(0, True), a_pod(1, True), a_pod(0, True)]
    waiting = waiting_gang("ns/j", spared(), pods, priority_of=at(7), created=0.0)
    assert waiting is not None and not waiting.spares_only
    assert [name for name, _ in waiting.request.pods] == ["j-worker-0", "j-worker-1"]
    assert waiting.request.needed == 2 and set(waiting.gated) == {"j-worker-0", "j-worker-1"}
    assert waiting.request.priority == 7


def test_a_new_gang_does_not_wait_for_its_spares_to_be_created() -> None:
    waiting = waiting_gang("ns/j", spared(), [a_pod(0, True), a_pod(1, True)], priority_of=at(0), created=0.0)
    assert waiting is not None and waiting.request.needed == 2


def test_spares_at_the_gate_alone_are_best_effort_behind_every_gang() -> None:
    # After a takeover, the replacement spare must neither preempt nor hold nodes (gang/admission.py).
    pods = [a_pod(0, False, node="n0"), a_pod(1, False, node="n0"), a_spare(1, True), a_spare(2, True)]
    waiting = waiting_gang("ns/j", spared(spares=2), pods, priority_of=at(10**9), created=0.0)
    assert waiting is not None and waiting.spares_only and not waiting.finishing
    assert [name for name, _ in waiting.request.pods] == ["j-spare-1", "j-spare-2"]
    assert waiting.request.needed == 1 and waiting.request.best_effort
    assert waiting.request.priority == SPARES_PRIORITY < -(2**31)


def test_a_running_gangs_idle_spares_are_victims_of_their_own_not_part_of_the_gang() -> None:
    job = spared()
    job["status"] = {"phase": "Running"}
    pods = [a_pod(0, False, node="n0"), a_pod(1, False, node="n1"), a_spare(0, False, node="n2")]
    gang = running_gang("ns/j", job, pods, priority_of=at(0), started=0.0)
    assert gang is not None and [p[0] for p in gang.pods] == ["j-worker-0", "j-worker-1"]
    spares = idle_spares("ns/j", job, pods, priority_of=at(0), started=0.0)
    assert [(s.key, s.idle_spare, [p[0] for p in s.pods]) for s in spares] == [("ns/j", True, ["j-spare-0"])]


def test_a_spare_told_a_rank_is_a_worker_of_the_gang_not_an_idle_spare() -> None:
    job = spared()
    spare = a_spare(0, False, node="n2")
    spare["metadata"]["uid"] = "s0"
    job["status"] = {"phase": "Restarting", "attempt": 1,
                     "inPlace": {"attempt": 1, "keptPods": [{"name": "j-spare-0", "uid": "s0", "rank": 1}]}}  # fmt: skip
    pods = [a_pod(0, False, attempt=1, node="n0"), spare]
    assert idle_spares("ns/j", job, pods, priority_of=at(0), started=0.0) == []


def test_a_running_gangs_ended_or_going_pods_are_no_room_a_preemption_frees() -> None:
    job = spared(spares=3)
    job["status"] = {"phase": "Running"}
    failed = a_spare(0, False, node="n2")
    failed["status"] = {"phase": "Failed"}
    going = a_spare(2, False, node="n4", deleting=True)
    pods = [
        a_pod(0, False, node="n0"),
        a_pod(1, False, node="n1"),
        failed,
        a_spare(1, False, node="n3"),
        going,
    ]
    gang = running_gang("ns/j", job, pods, priority_of=at(0), started=0.0)
    assert gang is not None and [p[0] for p in gang.pods] == ["j-worker-0", "j-worker-1"]
    spares = idle_spares("ns/j", job, pods, priority_of=at(0), started=0.0)
    assert [s.pods[0][0] for s in spares] == ["j-spare-1"]
