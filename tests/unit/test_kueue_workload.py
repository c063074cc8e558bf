"""Phalanx under Kueue, the pure parts: the Workload (kueue/workload.py), what Kueue says of it
(kueue/gate.py), the flavors on the pods (kueue/placement.py), what the owner writes back
(kueue/workload_status.py) and the job's rule (reconcile/rules/kueue.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx import constants as c
from phalanx import metrics
from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.pods import JobRef, build_worker_pod
from phalanx.controller import kueue_workloads
from phalanx.controller.kueue_workloads import (
    KueueWorkloads,
    job_key_of_workload,
    slim_workload,
)
from phalanx.k8s import CreationRefused, StatusConflict
from phalanx.kueue import workload_status
from phalanx.kueue.gate import KueueGate, gate_of
from phalanx.kueue.placement import FlavorConflict, PlacementUnavailable, placed_pod, placement_of
from phalanx.kueue.workload import (
    active_patch,
    build_workload,
    finalizer_release,
    managed_here,
    orphaned,
    queue_name,
    stale_in,
    workload_name,
)
from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit

T0 = "2026-12-01T10:00:00Z"
T1 = "2026-12-01T10:00:42Z"


def cond(type_: str, status: str, reason: str = "R", message: str = "m", at: str = T1) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


def admitted_workload(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "wl", "namespace": "ns", "creationTimestamp": T0, "generation": 1,
                     "resourceVersion": "5"},
        "status": {
            "admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "workers", "flavors": {"nvidia.com/gpu": "h100"}, "count": 2}]},
            "conditions": [cond("QuotaReserved", "True"), cond("Admitted", "True")],
            **status,
        },
    }  # fmt: skip


def gpu_job(**spec: Any) -> dict[str, Any]:
    return job(resources={"gpus": 1}, **spec)


# -- the Workload -----------------------------------------------------------------------------


def test_the_workload_holds_the_whole_gang_as_one_podset_with_its_accelerators_and_queue() -> None:
    tj = gpu_job(scheduling={"priorityClassName": "high"})
    tj["metadata"]["labels"] = {c.KUEUE_QUEUE_LABEL: "team-a"}
    spec = parse(TrainingJobSpec, tj["spec"])
    worker = build_worker_pod(JobRef.of(tj), spec, 0, 0, tj["spec"]["template"])
    wl = build_workload(tj, "team-a", spec.replicas, worker, 1000)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["metadata"]["name"] == workload_name("j", "u") and wl["metadata"]["namespace"] == "ns"
    (owner,) = wl["metadata"]["ownerReferences"]
    assert owner["kind"] == "TrainingJob" and owner["uid"] == "u" and owner["controller"] is True
    assert wl["spec"]["queueName"] == "team-a"
    (podset,) = wl["spec"]["podSets"]
    assert podset["name"] == "workers" and podset["count"] == 2
    (trainer,) = podset["template"]["spec"]["containers"]
    # Requests as the API server defaults them from limits: what Kueue counts against the quota.
    assert trainer["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    assert "schedulingGates" not in podset["template"]["spec"]
    assert wl["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }
    assert wl["spec"]["priority"] == 1000
    assert queue_name(tj) == "team-a" and queue_name(gpu_job()) is None


def test_a_mig_job_asks_kueue_for_its_mig_resource() -> None:
    tj = job(resources={"mig": {"profile": "1g.10gb", "count": 1}})
    spec = parse(TrainingJobSpec, tj["spec"])
    wl = build_workload(tj, "q", 2, build_worker_pod(JobRef.of(tj), spec, 0, 0, tj["spec"]["template"]), None)
    (trainer,) = wl["spec"]["podSets"][0]["template"]["spec"]["containers"]
    assert trainer["resources"]["requests"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert "priorityClassRef" not in wl["spec"] and "priority" not in wl["spec"]


def suspended_as(value: str | None, active: bool | None = None) -> dict[str, Any]:
    """A Workload on which the operator last wrote suspend=`value` (None: before it recorded it)."""
    annotations = {} if value is None else {c.KUEUE_SUSPENDED_ANNOTATION: value}
    return {"metadata": {"annotations": annotations}, "spec": {} if active is None else {"active": active}}


def test_a_suspended_job_deactivates_its_workload_and_a_resumed_one_activates_it() -> None:
    assert active_patch(suspended_as("false", True), suspended=True) == {
        "metadata": {"annotations": {c.KUEUE_SUSPENDED_ANNOTATION: "true"}},
        "spec": {"active": False},
    }
    assert active_patch(suspended_as("true", False), suspended=True) is None
    assert active_patch(suspended_as("true", False), suspended=False) == {
        "metadata": {"annotations": {c.KUEUE_SUSPENDED_ANNOTATION: "false"}},
        "spec": {"active": True},
    }
    # A Workload from before the operator recorded what it wrote: set once, recorded from then on.
    assert active_patch(suspended_as(None), suspended=False) is None
    assert active_patch(suspended_as(None), suspended=True) is not None


def test_a_workload_kueue_or_an_admin_deactivated_stays_inactive_while_suspend_is_unchanged() -> None:
    # backoffLimitCount, a rejected admission check, maximumExecutionTimeSeconds, kubectl: not undone.
    assert active_patch(suspended_as("false", False), suspended=False) is None


def test_a_suspended_job_gets_an_inactive_workload_and_records_it() -> None:
    wl = workload_of(gpu_job(runPolicy={"suspend": True}))
    assert wl["spec"]["active"] is False
    assert wl["metadata"]["annotations"] == {c.KUEUE_SUSPENDED_ANNOTATION: "true"}
    assert workload_of(gpu_job())["metadata"]["annotations"] == {c.KUEUE_SUSPENDED_ANNOTATION: "false"}


def test_a_workload_kueue_deactivated_says_kueues_reason() -> None:
    wl = {**admitted_workload(), **suspended_as("false", False)}
    wl["metadata"]["name"] = "wl"
    wl["status"] = {"conditions": [
        cond("Evicted", "True", "Deactivated", "The workload is deactivated"),
        cond("DeactivationTarget", "True", "RequeuingLimitExceeded", "exceeding the maximum number of re-queuing retries"),
    ]}  # fmt: skip
    gate = gate_of(wl)
    assert not gate.admitted
    assert "deactivated by Kueue (RequeuingLimitExceeded)" in gate.message
    assert "re-queuing retries" in gate.message and "spec.active" in gate.message
    # Deactivated by the operator (the job is suspended): the usual eviction message.
    assert "deactivated by Kueue" not in gate_of({**wl, **suspended_as("true", False)}).message


def workload_of(tj: dict[str, Any], queue: str = "q", priority: int | None = None) -> dict[str, Any]:
    spec = parse(TrainingJobSpec, tj["spec"])
    return build_workload(tj, queue, spec.replicas, build_worker_pod(JobRef.of(tj), spec, 0, 0, tj["spec"]["template"]),
                          priority)  # fmt: skip


def test_a_workload_built_from_the_job_as_it_is_now_is_not_stale() -> None:
    assert stale_in(workload_of(gpu_job()), workload_of(gpu_job())) == ""


def test_a_job_changed_since_its_workload_was_built_makes_it_stale_saying_what_changed() -> None:
    old = workload_of(gpu_job())
    assert "count 2" in stale_in(old, workload_of(gpu_job(replicas=8))) and "8" in stale_in(
        old, workload_of(gpu_job(replicas=8))
    )
    assert "requests" in stale_in(old, workload_of(job(resources={"gpus": 2})))
    assert "queue" in stale_in(old, workload_of(gpu_job(), queue="other"))
    high = gpu_job(scheduling={"priorityClassName": "high"})
    assert "priority" in stale_in(workload_of(high, priority=1000), workload_of(high, priority=7))
    assert "priority" in stale_in(old, workload_of(high, priority=1000))


def test_a_job_recreated_under_its_name_gets_a_workload_of_its_own() -> None:
    assert workload_name("j", "uid-1") != workload_name("j", "uid-2")
    assert workload_name("j", "uid-1") == workload_name("j", "uid-1")


def test_managed_by_another_controller_is_left_alone() -> None:
    assert managed_here(job()) and managed_here(job(managedBy=c.CONTROLLER_NAME))
    assert not managed_here(job(managedBy="kueue.x-k8s.io/multikueue"))


# -- what Kueue says ----------------------------------------------------------------------------


def test_an_admitted_workload_opens_the_gate_with_its_flavors_and_wait() -> None:
    gate = gate_of(admitted_workload())
    assert gate.admitted and not gate.evicted and gate.message == ""
    assert gate.cluster_queue == "cq" and gate.flavors == ("h100",) and gate.waited_seconds == 42


def test_a_pending_workload_says_kueues_reason() -> None:
    pending = {"metadata": {"name": "wl"}, "status": {"conditions": [
        cond("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set workers: insufficient quota")]}}  # fmt: skip
    gate = gate_of(pending)
    assert not gate.admitted and "insufficient quota" in gate.message and "Kueue" in gate.message
    # Before Kueue has looked at it at all:
    assert gate_of({"metadata": {"name": "wl"}}).message == "waiting for Kueue to consider Workload wl"


def test_an_evicted_workload_says_who_evicted_it() -> None:
    wl = admitted_workload()
    wl["status"]["conditions"].append(
        cond("Evicted", "True", "Preempted", "Preempted to accommodate a workload")
    )
    gate = gate_of(wl)
    assert gate.evicted and "evicted by Kueue (Preempted)" in gate.message


def test_an_evicted_workload_handed_back_says_why_it_is_not_admitted_again() -> None:
    released = {"metadata": {"name": "wl"}, "status": {"conditions": [
        cond("Evicted", "True", "Deactivated", "The workload is deactivated"),
        cond("QuotaReserved", "False", "Pending", "couldn't assign flavors: insufficient unused quota")]}}  # fmt: skip
    gate = gate_of(released)
    assert gate.evicted and not gate.admitted
    assert (
        gate.message.startswith("evicted by Kueue (Deactivated)")
        and "insufficient unused quota" in gate.message
    )


def test_waited_counts_from_the_last_requeue() -> None:
    wl = admitted_workload()
    wl["status"]["conditions"].append(cond("Requeued", "True", at="2026-12-01T10:00:40Z"))
    assert gate_of(wl).waited_seconds == 2


# -- the flavors on the pods ---------------------------------------------------------------------


def test_flavor_labels_and_tolerations_go_on_the_pod_and_the_gang_gate_comes_off() -> None:
    flavors = [
        {"spec": {"nodeLabels": {"pool": "a"}, "tolerations": [{"key": "t", "operator": "Exists"}]}},
        {"spec": {"nodeLabels": {"zone": "z1"}, "tolerations": [{"key": "t", "operator": "Exists"}]}},
    ]
    placement = placement_of(flavors)
    gated = {"spec": {"nodeSelector": {"disk": "ssd"}, "schedulingGates": [{"name": c.GANG_SCHEDULING_GATE}]}}
    placed = placed_pod(gated, placement)
    assert placed["spec"]["nodeSelector"] == {"disk": "ssd", "pool": "a", "zone": "z1"}
    assert placed["spec"]["tolerations"] == [{"key": "t", "operator": "Exists"}]
    assert "schedulingGates" not in placed["spec"]
    assert gated["spec"]["schedulingGates"]  # the input is not changed


def test_flavors_that_ask_two_values_of_one_label_conflict() -> None:
    with pytest.raises(FlavorConflict, match="pool"):
        placement_of([{"spec": {"nodeLabels": {"pool": "a"}}}, {"spec": {"nodeLabels": {"pool": "b"}}}])


# -- what the owner writes back -------------------------------------------------------------------


def test_pods_ready_goes_true_once_the_gang_runs() -> None:
    wl = admitted_workload()
    waiting = workload_status.pods_ready(wl, False, T1)
    assert waiting is not None
    (ready_false,) = [x for x in waiting["conditions"] if x["type"] == "PodsReady"]
    assert ready_false["status"] == "False" and ready_false["reason"] == "WaitForStart"
    wl["status"]["conditions"] = waiting["conditions"]
    assert workload_status.pods_ready(wl, False, T1) is None  # no write when nothing changes
    ready = workload_status.pods_ready(wl, True, T1)
    assert ready is not None
    assert [x["reason"] for x in ready["conditions"] if x["type"] == "PodsReady"] == ["Started"]


def test_finished_is_written_once() -> None:
    wl = admitted_workload()
    patch = workload_status.finished(wl, False, "worker 1 exited 1", T1)
    assert patch is not None
    (done,) = [x for x in patch["conditions"] if x["type"] == "Finished"]
    assert done["status"] == "True" and done["reason"] == "Failed"
    wl["status"]["conditions"] = patch["conditions"]
    assert workload_status.finished(wl, False, "again", T1) is None


def test_after_an_eviction_the_quota_is_handed_back_and_the_workload_requeued() -> None:
    wl = admitted_workload()
    assert workload_status.released_after_eviction(wl, T1) is None  # not evicted: nothing to give back
    wl["status"]["conditions"].append(cond("Evicted", "True", "Preempted", "Preempted to accommodate"))
    patch = workload_status.released_after_eviction(wl, T1)
    assert patch is not None and patch["admission"] is None
    by_type = {x["type"]: x for x in patch["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False" and by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["Admitted"]["status"] == "False" and by_type["Requeued"]["status"] == "True"
    assert by_type["Evicted"]["status"] == "True"  # Kueue clears it when it admits again


def test_pods_stuck_terminating_on_a_lost_node_count_as_stopped_so_the_quota_goes_back() -> None:
    # A NotReady node's pods say Running forever (nobody confirms their deletion): Kueue's quota
    # must go back all the same, as the restart does not wait for them either (policy/node_loss.py).
    lost = {"n1": {"metadata": {"name": "n1"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": iso(NOW - 120)}]}}}  # fmt: skip
    nodes = {**NODES, **lost}
    deleting = {"deletionTimestamp": iso(NOW - 60)}
    stuck = pod(1, metadata=deleting, spec={"nodeName": "n1"})
    done = pod(0, phase="Failed")
    assert workload_status.gang_stopped([done, stuck], nodes, NOW, node_lost_after=20.0)
    # On a Ready node a Running pod is still running: the quota is held until it ends.
    assert not workload_status.gang_stopped(
        [done, pod(1, metadata=deleting)], nodes, NOW, node_lost_after=20.0
    )
    # Not yet lost (NotReady for less than node_lost_after): waited for.
    assert not workload_status.gang_stopped([done, stuck], nodes, NOW, node_lost_after=300.0)


def pods_ready_of(conditions: list[dict[str, Any]]) -> tuple[str, str]:
    (ready,) = [x for x in conditions if x["type"] == "PodsReady"]
    return ready["status"], ready["reason"]


def test_an_evicted_workload_is_not_ready_waiting_for_start_so_readmission_starts_afresh() -> None:
    wl = admitted_workload()
    wl["status"]["conditions"] += [
        cond("PodsReady", "True", "Started", "running"),
        cond("Evicted", "True", "Preempted", "Preempted to accommodate"),
    ]
    waiting = workload_status.waiting_for_start(wl, T1)
    assert waiting is not None and pods_ready_of(waiting["conditions"]) == ("False", "WaitForStart")
    released = workload_status.released_after_eviction(wl, T1)
    assert released is not None and pods_ready_of(released["conditions"]) == ("False", "WaitForStart")
    # Admitted again, the new gang not yet ready: it is starting, not recovering.
    readmitted = admitted_workload()
    readmitted["status"]["conditions"] = [
        *readmitted["status"]["conditions"],
        *[x for x in released["conditions"] if x["type"] == "PodsReady"],
    ]
    assert workload_status.pods_ready(readmitted, False, T1) is None


def test_while_evicted_pods_still_stop_the_owner_writes_pods_ready_false() -> None:
    wl = admitted_workload()
    wl["spec"] = {}
    wl["status"]["conditions"] += [
        cond("PodsReady", "True", "Started", "running"),
        cond("Evicted", "True", "Preempted", "Preempted to accommodate"),
    ]
    api = FakeWorkloadApi(wl)
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    kueue.last["ns/j"] = wl
    evicted = gate_of(wl)
    kueue.report(
        "ns/j", evicted, {"phase": "Pending"}, [pod(0, metadata={"deletionTimestamp": T1})], NODES, NOW, 20.0
    )
    (patch,) = api.status_patches
    assert pods_ready_of(patch["conditions"]) == ("False", "WaitForStart") and "admission" not in patch


def test_finished_written_over_a_conflict_is_retried_on_the_workload_read_again() -> None:
    wl = {**admitted_workload(), "spec": {}}
    api = FakeWorkloadApi(wl, conflicts=1)  # Kueue wrote meanwhile
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    kueue.last["ns/j"] = wl
    done = {"phase": "Succeeded", "message": "done"}
    pending = kueue.report("ns/j", gate_of(wl), done, [pod(0, phase="Succeeded")], NODES, NOW, 20.0)
    (patch,) = api.status_patches
    assert [x["reason"] for x in patch["conditions"] if x["type"] == "Finished"] == ["Succeeded"]
    assert pending is False
    # Conflicting on every try: the caller is told to come back soon (a finished job is not resynced).
    busy = FakeWorkloadApi({**admitted_workload(), "spec": {}}, conflicts=100)
    kueue = KueueWorkloads(busy, "cluster.local")  # type: ignore[arg-type]
    kueue.last["ns/j"] = busy.workload  # type: ignore[assignment]
    assert kueue.report("ns/j", gate_of(wl), done, [], NODES, NOW, 20.0) is True and busy.status_patches == []


# -- the rule ------------------------------------------------------------------------------------

WAITING = KueueGate(
    workload="wl", admitted=False, evicted=False, message="waiting for Kueue: insufficient quota"
)
ADMITTED = KueueGate(workload="wl", admitted=True, evicted=False, message="", cluster_queue="cq",
                     flavors=("h100",), waited_seconds=12.0)  # fmt: skip


def test_a_queued_job_creates_no_pod_until_kueue_admits_it() -> None:
    plan = decide(gpu_job(), [], NODES, NOW, kueue_gate=WAITING)
    assert plan.create_indices == [] and plan.status["phase"] == "Pending"
    assert plan.status["message"] == WAITING.message
    assert plan.recheck_after is not None  # the Workload is read again soon


def test_an_admitted_job_creates_its_gang_and_says_who_admitted_it() -> None:
    plan = decide(gpu_job(), [], NODES, NOW, kueue_gate=ADMITTED)
    assert plan.create_indices == [0, 1]
    assert plan.status["admission"] == {
        "by": "Kueue",
        "workload": "wl",
        "clusterQueue": "cq",
        "waitedSeconds": 12,
    }


def test_the_builtin_admission_says_so() -> None:
    status = {"attempt": 0, "createdAttempt": 0, "phase": "Pending"}
    created = {"metadata": {"creationTimestamp": iso(NOW - 30)}}
    plan = decide(job(dict(status)), [pod(0, **created), pod(1, **created)], NODES, NOW)
    assert plan.status["admission"] == {"by": "Builtin", "waitedSeconds": 30}


def test_an_evicted_gang_stops_with_its_grace_period_counts_a_preemption_and_waits() -> None:
    evicted = KueueGate(workload="wl", admitted=True, evicted=True, eviction_reason="Preempted",
                        message="evicted by Kueue (Preempted): Preempted to accommodate a workload")  # fmt: skip
    status = {**RUNNING, "restarts": {"failures": 0, "preemptions": 0}, "admission": {"by": "Kueue"}}
    plan = decide(gpu_job(status=status), [pod(0), pod(1)], NODES, NOW, kueue_gate=evicted)
    assert sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1"] and plan.force_delete_pods == []
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}
    assert plan.status["attempt"] == 1 and plan.status["phase"] == "Pending"
    assert "admission" not in plan.status and "checkpoint" in plan.status["message"]
    # The next look, pods gone: still waiting, and the preemption is not counted twice.
    again = decide(gpu_job(status=plan.status), [], NODES, NOW + 2, kueue_gate=evicted)
    assert again.status["restarts"]["preemptions"] == 1 and again.create_indices == []


def evicted_by(reason: str, message: str) -> KueueGate:
    return gate_of(admitted_workload(conditions=[
        cond("QuotaReserved", "True"), cond("Admitted", "True"), cond("Evicted", "True", reason, message)]))  # fmt: skip


def admitted_reason(status: dict[str, Any]) -> str:
    return next(str(x["reason"]) for x in status["conditions"] if x["type"] == "Admitted")


RUNNING_UNDER_KUEUE = {**RUNNING, "restarts": {"failures": 0, "preemptions": 0}, "admission": {"by": "Kueue"}}


def test_only_a_preemption_by_kueue_counts_as_a_preemption() -> None:
    gate = evicted_by("Preempted", "Preempted to accommodate a workload (UID: u) due to prioritization")
    plan = decide(gpu_job(status=dict(RUNNING_UNDER_KUEUE)), [pod(0), pod(1)], NODES, NOW, kueue_gate=gate)
    assert plan.status["restarts"]["preemptions"] == 1 and not plan.status["restarts"].get("requeues")
    assert admitted_reason(plan.status) == "EvictedByKueue"
    assert [x["status"] for x in plan.status["conditions"] if x["type"] == "Preempted"] == ["True"]


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("PodsReadyTimeout", "Exceeded the PodsReady timeout default/wl"),
        ("AdmissionCheck", "At least one admission check is false"),
        ("ClusterQueueStopped", "The ClusterQueue is stopped"),
        ("LocalQueueStopped", "The LocalQueue is stopped"),
    ],
)
def test_an_eviction_other_than_a_preemption_is_a_requeue_in_its_own_words(reason: str, message: str) -> None:
    gate = evicted_by(reason, message)
    plan = decide(gpu_job(status=dict(RUNNING_UNDER_KUEUE)), [pod(0), pod(1)], NODES, NOW, kueue_gate=gate)
    assert sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1"] and plan.status["attempt"] == 1
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 0, "requeues": 1}
    assert admitted_reason(plan.status) == "RequeuedByKueue"
    assert reason in plan.status["message"] and message in plan.status["message"]
    assert not [x for x in plan.status["conditions"] if x["type"] == "Preempted" and x["status"] == "True"]
    assert [(e.reason, reason in e.message) for e in plan.events] == [("RequeuedByKueue", True)]


def test_a_gang_that_succeeded_as_kueue_evicts_it_ends_succeeded_not_requeued() -> None:
    gate = evicted_by("Preempted", "Preempted to accommodate a workload")
    done = [pod(0, phase="Succeeded", exit_code=0), pod(1, phase="Succeeded", exit_code=0)]
    plan = decide(gpu_job(status=dict(RUNNING_UNDER_KUEUE)), done, NODES, NOW, kueue_gate=gate)
    assert plan.status["phase"] == "Succeeded" and plan.delete_pods == []
    assert plan.status["restarts"]["preemptions"] == 0 and plan.status["attempt"] == 0


def test_no_pod_starts_against_a_stale_workload_that_holds_quota_but_a_running_gang_goes_on() -> None:
    stale = KueueGate(workload="wl", admitted=True, evicted=False, message="", cluster_queue="cq",
                      stale="podSet workers: count 2, the job asks 8")  # fmt: skip
    plan = decide(gpu_job(), [], NODES, NOW, kueue_gate=stale)
    assert plan.create_indices == [] and plan.status["phase"] == "Pending"
    assert "count 2, the job asks 8" in plan.status["message"]
    running = decide(gpu_job(status=dict(RUNNING)), [pod(0), pod(1)], NODES, NOW, kueue_gate=stale)
    assert running.delete_pods == [] and running.status["phase"] == "Running"


class FakeWorkloadApi:
    """The Workload calls of KubeApi, on one in-memory Workload."""

    def __init__(self, workload: dict[str, Any] | None = None, conflicts: int = 0) -> None:
        self.workload = workload
        self.deleted: list[str] = []
        self.created = 0
        self.conflicts = conflicts
        self.status_patches: list[dict[str, Any]] = []
        self.spec_patches: list[dict[str, Any]] = []

    flavors: dict[str, dict[str, Any]] = {}

    def priority_values(self) -> dict[str, int]:
        return {}

    def get_resource_flavor(self, name: str) -> dict[str, Any] | None:
        return self.flavors.get(name)

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.workload

    def create_if_absent(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        if self.workload is not None:
            return None
        self.created += 1
        self.workload = {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": "1"}}
        return self.workload

    def delete_workload(self, namespace: str, name: str, uid: str | None) -> None:
        self.deleted.append(name)
        self.workload = None

    def patch_workload(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        assert self.workload is not None
        self.spec_patches.append(patch)
        meta = {**self.workload["metadata"]}
        annotations = {
            **(meta.get("annotations") or {}),
            **(patch.get("metadata") or {}).get("annotations", {}),
        }
        meta["annotations"] = annotations
        if "finalizers" in (patch.get("metadata") or {}):
            meta["finalizers"] = patch["metadata"]["finalizers"] or []
        self.workload = {
            **self.workload,
            "metadata": meta,
            "spec": {**self.workload["spec"], **patch.get("spec", {})},
        }
        return self.workload

    def patch_workload_status(
        self, namespace: str, name: str, status: dict[str, Any], rv: str
    ) -> dict[str, Any] | None:
        assert self.workload is not None
        if self.conflicts:
            self.conflicts -= 1
            raise StatusConflict("changed")
        self.status_patches.append(status)
        merged = {**(self.workload.get("status") or {}), **status}
        self.workload = {**self.workload, "status": {k: v for k, v in merged.items() if v is not None}}
        return self.workload


def queued(tj: dict[str, Any]) -> dict[str, Any]:
    tj["metadata"]["labels"] = {c.KUEUE_QUEUE_LABEL: "q"}
    return tj


def test_a_stale_workload_without_quota_is_recreated_from_the_job_as_it_is_now() -> None:
    old = workload_of(queued(gpu_job()))
    old["metadata"]["resourceVersion"] = "3"
    api = FakeWorkloadApi(old)
    resized = queued(gpu_job(replicas=8))
    gate = KueueWorkloads(api, "cluster.local").gate(
        "ns/j", resized, parse(TrainingJobSpec, resized["spec"]), "q"
    )  # type: ignore[arg-type]
    assert api.deleted == [old["metadata"]["name"]] and api.created == 1
    assert api.workload is not None and api.workload["spec"]["podSets"][0]["count"] == 8
    assert gate.stale == "" and not gate.admitted


def test_a_stale_workload_holding_quota_is_kept_and_the_gate_says_it_is_stale() -> None:
    old = workload_of(queued(gpu_job()))
    old["metadata"]["resourceVersion"] = "3"
    old["status"] = admitted_workload()["status"]
    api = FakeWorkloadApi(old)
    resized = queued(gpu_job(replicas=8))
    gate = KueueWorkloads(api, "cluster.local").gate(
        "ns/j", resized, parse(TrainingJobSpec, resized["spec"]), "q"
    )  # type: ignore[arg-type]
    assert api.deleted == [] and "count 2" in gate.stale


# -- the wait by admitter ------------------------------------------------------------------------


def admission_wait_count(admitted_by: str, cluster_queue: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "phalanx_admission_wait_seconds_count", {"admitted_by": admitted_by, "cluster_queue": cluster_queue}
    )
    return value or 0.0


def test_the_admission_wait_is_observed_once_per_kueue_admission_under_its_cluster_queue() -> None:
    before = admission_wait_count("Kueue", "cq-metric")
    admitted = {
        "phase": "Admitted",
        "admission": {"by": "Kueue", "clusterQueue": "cq-metric", "waitedSeconds": 7},
    }
    metrics.observe_status("ns", "metric-job", {"phase": "Pending"}, admitted)
    metrics.observe_status("ns", "metric-job", admitted, {**admitted, "phase": "Running"})  # same admission
    assert admission_wait_count("Kueue", "cq-metric") == before + 1
    builtin_before = admission_wait_count("Builtin", "")
    metrics.observe_gang_admitted("ns", "other-job", 3.0)
    assert admission_wait_count("Builtin", "") == builtin_before + 1
    metrics.forget_job("ns", "metric-job")
    metrics.forget_job("ns", "other-job")


def test_a_failed_job_hands_its_quota_back_only_once_its_pods_have_stopped() -> None:
    # From the review (item 7): Finished was written in the pass that began deleting a failed job's
    # still-running pods, so Kueue admitted the next job onto GPUs still in their grace period.
    wl = {**admitted_workload(), "spec": {}}
    api = FakeWorkloadApi(wl)
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    kueue.last["ns/j"] = wl
    failed = {"phase": "Failed", "message": "worker-1 exited 1"}
    stopping = [pod(0, metadata={"deletionTimestamp": T1}), pod(1, phase="Failed")]
    assert kueue.report("ns/j", gate_of(wl), failed, stopping, NODES, NOW, 20.0) is True  # come back
    assert api.status_patches == []
    kueue.report(
        "ns/j", gate_of(wl), failed, [pod(0, phase="Failed"), pod(1, phase="Failed")], NODES, NOW, 20.0
    )
    (patch,) = api.status_patches
    assert [x["reason"] for x in patch["conditions"] if x["type"] == "Finished"] == ["Failed"]


# -- Kueue's finalizer: the quota stays booked until the gang has stopped ---------------------------


class ListedWorkloadApi:
    """list_workloads and patch_workload of KubeApi over a few in-memory Workloads."""

    def __init__(self, *workloads: dict[str, Any]) -> None:
        self.workloads = {w["metadata"]["name"]: w for w in workloads}
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def list_workloads(self, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        wanted = dict(term.split("=", 1) for term in label_selector.split(","))
        return [w for w in self.workloads.values()
                if all(w["metadata"]["labels"].get(k) == v for k, v in wanted.items())]  # fmt: skip

    def patch_workload(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        self.patches.append((name, patch))
        self.workloads[name]["metadata"]["finalizers"] = patch["metadata"]["finalizers"] or []
        return self.workloads[name]


def deleted_workload(uid: str = "uid-1", name: str = "wl") -> dict[str, Any]:
    tj = queued(gpu_job())
    tj["metadata"]["uid"] = uid
    wl = workload_of(tj)
    wl["metadata"].update(name=name, resourceVersion="7", deletionTimestamp=T1)
    return wl


def test_a_workload_is_created_with_kueues_resource_in_use_finalizer() -> None:
    wl = workload_of(queued(gpu_job()))
    assert wl["metadata"]["finalizers"] == ["kueue.x-k8s.io/resource-in-use"]


def test_the_finalizer_comes_off_guarded_by_the_resource_version_keeping_any_other() -> None:
    wl = deleted_workload()
    wl["metadata"]["finalizers"] = ["example.com/other", c.KUEUE_RESOURCE_IN_USE_FINALIZER]
    assert finalizer_release(wl) == {
        "metadata": {"finalizers": ["example.com/other"], "resourceVersion": "7"}
    }
    wl["metadata"]["finalizers"] = [c.KUEUE_RESOURCE_IN_USE_FINALIZER]
    assert finalizer_release(wl) == {"metadata": {"finalizers": None, "resourceVersion": "7"}}
    wl["metadata"]["finalizers"] = []
    assert finalizer_release(wl) is None


def test_a_workload_is_orphaned_once_deleted_or_its_job_gone_or_recreated() -> None:
    wl = deleted_workload(uid="uid-1")
    assert orphaned(wl, "uid-1")  # deleted: nothing runs against it again
    del wl["metadata"]["deletionTimestamp"]
    assert not orphaned(wl, "uid-1")
    assert orphaned(wl, None) and orphaned(wl, "uid-2")  # its job gone, or re-created under the name


def test_a_deleted_jobs_workload_keeps_its_finalizer_until_every_pod_has_stopped() -> None:
    api = ListedWorkloadApi(deleted_workload(uid="uid-1"))
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    mine = {"metadata": {"ownerReferences": [{"controller": True, "uid": "uid-1", "kind": "TrainingJob"}]}}
    stopping = [
        pod(0, metadata={**mine["metadata"], "deletionTimestamp": T1}),
        pod(1, phase="Failed", **mine),
    ]
    assert kueue.release_orphans("ns/j", None, stopping, NODES, NOW, 20.0) is True  # come back
    assert api.patches == [] and "ns/j" in kueue.pending_release
    stopped = [pod(0, phase="Failed", **mine), pod(1, phase="Succeeded", **mine)]
    assert kueue.release_orphans("ns/j", None, stopped, NODES, NOW, 20.0) is False
    ((name, patch),) = api.patches
    assert name == "wl" and patch["metadata"]["finalizers"] is None
    assert "ns/j" not in kueue.pending_release


def test_a_predecessors_workload_goes_with_its_own_pods_not_the_new_jobs() -> None:
    # Re-created under the same name: the new job's running pods do not hold the old Workload.
    old = deleted_workload(uid="uid-old", name="wl-old")
    del old["metadata"]["deletionTimestamp"]  # garbage collection has not got to it yet
    api = ListedWorkloadApi(old)
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    new_pods = [
        pod(0, metadata={"ownerReferences": [{"controller": True, "uid": "uid-new", "kind": "TrainingJob"}]})
    ]
    assert kueue.release_orphans("ns/j", "uid-new", new_pods, NODES, NOW, 20.0) is False
    assert [name for name, _ in api.patches] == ["wl-old"]


def test_the_resync_finds_the_jobs_of_workloads_left_holding_the_finalizer() -> None:
    live = deleted_workload(uid="uid-live", name="wl-live")
    del live["metadata"]["deletionTimestamp"]
    gone = deleted_workload(uid="uid-gone", name="wl-gone")
    gone["metadata"]["labels"] = {**gone["metadata"]["labels"], c.LABEL_JOB_NAME: "k"}
    api = ListedWorkloadApi(live, gone)
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    keys = kueue.orphan_keys([], {"ns/j": "uid-live"}.get)
    assert keys == ["ns/k"] and kueue.may_hold_quota("ns/k") and not kueue.may_hold_quota("ns/j")


# -- placement: the flavors' and the admission checks' -------------------------------------------

H100 = {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"gpu": "h100"}}}


def admitted_gate(flavors: dict[str, dict[str, Any]], **status: Any) -> tuple[KueueWorkloads, KueueGate]:
    tj = queued(gpu_job())
    wl = workload_of(tj)
    wl["metadata"]["resourceVersion"] = "3"
    wl["status"] = admitted_workload(**status)["status"]
    api = FakeWorkloadApi(wl)
    api.flavors = flavors
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    return kueue, kueue.gate("ns/j", tj, parse(TrainingJobSpec, tj["spec"]), "q")


def test_admission_check_pod_set_updates_go_on_the_pods_with_the_flavors_placement() -> None:
    update = {"name": "workers", "labels": {"team": "a"}, "annotations": {"prov/req": "r1"},
              "nodeSelector": {"zone": "z1"}, "tolerations": [{"key": "prov", "operator": "Exists"}]}  # fmt: skip
    kueue, gate = admitted_gate(
        {"h100": H100}, admissionChecks=[{"name": "prov", "state": "Ready", "podSetUpdates": [update]}]
    )
    tj = gpu_job()
    spec = parse(TrainingJobSpec, tj["spec"])
    pod_ = placed_pod(
        build_worker_pod(JobRef.of(tj), spec, 0, 0, tj["spec"]["template"]), kueue.placement(gate)
    )
    assert pod_["spec"]["nodeSelector"] == {"gpu": "h100", "zone": "z1"}
    assert {"key": "prov", "operator": "Exists"} in pod_["spec"]["tolerations"]
    assert pod_["metadata"]["labels"]["team"] == "a" and pod_["metadata"]["annotations"]["prov/req"] == "r1"


def test_no_pod_starts_when_an_assigned_flavor_is_missing_and_the_status_says_which() -> None:
    _, gate = admitted_gate({})
    plan = decide(gpu_job(), [], NODES, NOW, kueue_gate=gate)
    assert plan.create_indices == [] and plan.status["phase"] == "Pending"
    assert "ResourceFlavor h100" in plan.status["message"], plan.status["message"]


def test_admission_checks_that_ask_two_values_of_one_node_label_start_no_pod_and_say_so() -> None:
    checks = [
        {
            "name": "a",
            "state": "Ready",
            "podSetUpdates": [{"name": "workers", "nodeSelector": {"gpu": "a100"}}],
        },
    ]
    _, gate = admitted_gate({"h100": H100}, admissionChecks=checks)
    plan = decide(gpu_job(), [], NODES, NOW, kueue_gate=gate)
    assert plan.create_indices == [] and plan.status["phase"] == "Failed"  # it never places
    assert "gpu" in plan.status["message"] and "'a100'" in plan.status["message"], plan.status["message"]


# -- Kueue's webhook refusing the Workload -------------------------------------------------------

DENIED = (
    'admission webhook "vworkload.kb.io" denied the request: spec.podSets[0].minCount: '
    "Invalid value: 3: should be less than or equal to 2"
)


class RefusingWorkloadApi(FakeWorkloadApi):
    def create_if_absent(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        raise CreationRefused(403, DENIED)


def test_a_workload_kueues_webhook_refuses_says_its_words_in_status_and_an_event_and_backs_off() -> None:
    tj = queued(gpu_job())
    clock = [1000.0]
    kueue = KueueWorkloads(RefusingWorkloadApi(), "cluster.local", clock=lambda: clock[0])  # type: ignore[arg-type]
    spec = parse(TrainingJobSpec, tj["spec"])
    plan = decide(tj, [], NODES, NOW, kueue_gate=kueue.gate("ns/j", tj, spec, "q"))
    assert plan.create_indices == [] and plan.status["phase"] == "Pending"
    assert DENIED in plan.status["message"]
    assert admitted_reason(plan.status) == "WorkloadRefused"
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "WorkloadRefused")]
    first_wait = plan.recheck_after
    assert first_wait is not None
    clock[0] += first_wait
    again = decide(
        {**tj, "status": plan.status}, [], NODES, NOW + 2, kueue_gate=kueue.gate("ns/j", tj, spec, "q")
    )
    assert again.events == []  # said once while the words stay the same
    assert first_wait is not None and again.recheck_after is not None and again.recheck_after > first_wait


# -- the watch -------------------------------------------------------------------------------------


def test_a_watched_workload_change_enqueues_its_job_and_only_ours() -> None:
    wl = deleted_workload()
    assert job_key_of_workload(slim_workload(wl)) == "ns/j"
    assert slim_workload(wl)["metadata"]["resourceVersion"] == "7"  # every change of Kueue's is one
    assert job_key_of_workload({"metadata": {"namespace": "ns", "name": "other", "labels": {}}}) is None


# -- a Workload deleted under a live job (`kubectl delete workload`: Kueue's way to requeue) ---------


def deleting_admitted(tj: dict[str, Any]) -> tuple[FakeWorkloadApi, KueueWorkloads]:
    wl = workload_of(tj)
    wl["metadata"].update(resourceVersion="9", deletionTimestamp=T1)
    wl["status"] = admitted_workload()["status"]
    api = FakeWorkloadApi(wl)
    api.flavors = {"h100": H100}
    return api, KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]


def test_a_deleted_workload_starts_no_gang_and_is_released_then_made_again() -> None:
    tj = queued(gpu_job())
    api, kueue = deleting_admitted(tj)
    spec = parse(TrainingJobSpec, tj["spec"])
    gate = kueue.gate("ns/j", tj, spec, "q")
    assert not gate.admitted and gate.evicted and gate.eviction_reason == "WorkloadDeleted"
    plan = decide(tj, [], NODES, NOW, kueue_gate=gate)
    assert plan.create_indices == [] and plan.status["phase"] == "Pending"
    # Nothing runs on it: the finalizer comes off, and no 1 s loop is asked for.
    assert kueue.report("ns/j", gate, plan.status, [], NODES, NOW, 20.0) is False
    assert api.workload is not None and api.workload["metadata"]["finalizers"] == []
    api.workload = None  # gone: the next pass queues a fresh one
    fresh = kueue.gate("ns/j", tj, spec, "q")
    assert api.created == 1 and not fresh.evicted


def test_a_running_gang_on_a_deleted_workload_is_stopped_as_a_requeue_and_then_released() -> None:
    tj = queued(gpu_job(status=dict(RUNNING_UNDER_KUEUE)))
    api, kueue = deleting_admitted(tj)
    gate = kueue.gate("ns/j", tj, parse(TrainingJobSpec, tj["spec"]), "q")
    plan = decide(tj, [pod(0), pod(1)], NODES, NOW, kueue_gate=gate)
    assert sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1"]
    assert plan.status["restarts"]["requeues"] == 1 and "WorkloadDeleted" in plan.status["message"]
    stopping = [pod(0, metadata={"deletionTimestamp": T1}), pod(1, metadata={"deletionTimestamp": T1})]
    # Its pods still stop: the finalizer stays; the rule's recheck comes back, not a 1 s loop.
    assert kueue.report("ns/j", gate, plan.status, stopping, NODES, NOW, 20.0) is False
    assert plan.recheck_after is not None
    assert (
        api.workload is not None
        and c.KUEUE_RESOURCE_IN_USE_FINALIZER in api.workload["metadata"]["finalizers"]
    )
    kueue.report("ns/j", gate, plan.status, [], NODES, NOW + 30, 20.0)
    assert api.workload["metadata"]["finalizers"] == []


def test_the_live_jobs_own_deleted_workload_is_left_to_its_reconcile_not_the_orphan_sweep() -> None:
    own = deleted_workload(uid="uid-1")
    api = ListedWorkloadApi(own)
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    assert kueue.orphan_keys([], {"ns/j": "uid-1"}.get) == []
    assert kueue.release_orphans("ns/j", "uid-1", [], NODES, NOW, 20.0) is False and api.patches == []


# -- a placement that cannot be made: the job fails so that the quota goes back --------------------


def test_flavors_that_conflict_fail_the_job_and_finish_the_workload_so_the_quota_goes_back() -> None:
    checks = [
        {
            "name": "a",
            "state": "Ready",
            "podSetUpdates": [{"name": "workers", "nodeSelector": {"gpu": "a100"}}],
        }
    ]
    kueue, gate = admitted_gate({"h100": H100}, admissionChecks=checks)
    plan = decide(queued(gpu_job()), [], NODES, NOW, kueue_gate=gate)
    assert plan.create_indices == [] and plan.status["phase"] == "Failed"
    failed = [
        x["reason"] for x in plan.status["conditions"] if x["type"] == "Failed" and x["status"] == "True"
    ]
    assert failed == ["FailedToStart"] and "'a100'" in plan.status["message"]
    kueue.report("ns/j", gate, plan.status, [], NODES, NOW, 20.0)
    api = kueue.api
    assert isinstance(api, FakeWorkloadApi)
    (patch,) = api.status_patches
    assert [x["reason"] for x in patch["conditions"] if x["type"] == "Finished"] == ["Failed"]


def test_a_missing_flavor_is_waited_for_a_bounded_time_then_the_job_fails() -> None:
    tj = queued(gpu_job())
    wl = workload_of(tj)
    wl["metadata"]["resourceVersion"] = "3"
    wl["status"] = admitted_workload()["status"]
    clock = [1000.0]
    kueue = KueueWorkloads(FakeWorkloadApi(wl), "cluster.local", clock=lambda: clock[0])  # type: ignore[arg-type]
    spec = parse(TrainingJobSpec, tj["spec"])
    first = decide(tj, [], NODES, NOW, kueue_gate=kueue.gate("ns/j", tj, spec, "q"))
    assert first.status["phase"] == "Pending"  # it may be created again
    clock[0] += kueue_workloads.FLAVOR_MISSING_MAX_SECONDS + 1
    later = decide(tj, [], NODES, NOW, kueue_gate=kueue.gate("ns/j", tj, spec, "q"))
    assert later.status["phase"] == "Failed" and "ResourceFlavor h100" in later.status["message"]


# -- a finished Workload drops the finalizer (nothing is left for GC to wait on after an uninstall) -


def test_a_finished_workload_drops_the_finalizer_once_the_gang_stopped_and_keeps_it_off() -> None:
    tj = queued(gpu_job())
    wl = workload_of(tj)
    wl["metadata"]["resourceVersion"] = "3"
    wl["status"] = admitted_workload()["status"]
    api = FakeWorkloadApi(wl)
    api.flavors = {"h100": H100}
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    spec = parse(TrainingJobSpec, tj["spec"])
    gate = kueue.gate("ns/j", tj, spec, "q")
    done = {"phase": "Succeeded", "message": "done"}
    stopped = [pod(0, phase="Succeeded", exit_code=0), pod(1, phase="Succeeded", exit_code=0)]
    kueue.report("ns/j", gate, done, stopped, NODES, NOW, 20.0)
    assert api.workload is not None and api.workload["metadata"]["finalizers"] == []
    # A later pass reads it finished: the finalizer is not put back.
    kueue.report("ns/j", kueue.gate("ns/j", tj, spec, "q"), done, stopped, NODES, NOW + 1, 20.0)
    assert api.workload["metadata"]["finalizers"] == []


# -- a refusal (Kueue's webhook) while the gang runs ------------------------------------------------


class RefusingLaterApi(FakeWorkloadApi):
    """Serves the Workload until `refuse`: then it is gone and making it again is refused."""

    refuse = False

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None if self.refuse else self.workload

    def create_if_absent(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        if self.refuse:
            raise CreationRefused(403, DENIED)
        return super().create_if_absent(manifest)


def admitted_api(api: FakeWorkloadApi, tj: dict[str, Any]) -> FakeWorkloadApi:
    api.workload = workload_of(tj)
    api.workload["metadata"]["resourceVersion"] = "3"
    api.workload["status"] = admitted_workload()["status"]
    api.flavors = {"h100": H100}
    return api


def test_a_refusal_while_the_gang_runs_keeps_the_last_admission_and_writes_nothing_on_it() -> None:
    tj = queued(gpu_job(status=dict(RUNNING_UNDER_KUEUE)))
    api = admitted_api(RefusingLaterApi(), tj)
    assert isinstance(api, RefusingLaterApi)
    kueue = KueueWorkloads(api, "cluster.local")  # type: ignore[arg-type]
    spec = parse(TrainingJobSpec, tj["spec"])
    assert kueue.gate("ns/j", tj, spec, "q").admitted
    api.refuse = True
    gate = kueue.gate("ns/j", tj, spec, "q")
    assert gate.refused and gate.admitted  # the last read, kept
    plan = decide(tj, [pod(0), pod(1)], NODES, NOW, kueue_gate=gate)
    assert plan.delete_pods == [] and plan.status["phase"] == "Running"
    # No PodsReady=False WaitForStart on an admitted, running Workload (Kueue may evict it for it).
    assert kueue.report("ns/j", gate, plan.status, [pod(0), pod(1)], NODES, NOW, 20.0) is False
    assert api.status_patches == []


class RefusingPatchApi(FakeWorkloadApi):
    def patch_workload(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        raise CreationRefused(403, DENIED)


def test_a_refused_finalizer_patch_on_an_older_workload_leaves_the_job_admitted() -> None:
    tj = queued(gpu_job())
    api = admitted_api(RefusingPatchApi(), tj)
    assert api.workload is not None
    api.workload["metadata"]["finalizers"] = []  # made by an operator version that did not set it
    gate = KueueWorkloads(api, "cluster.local").gate("ns/j", tj, parse(TrainingJobSpec, tj["spec"]), "q")  # type: ignore[arg-type]
    assert gate.admitted and not gate.refused


class CountingRefusingApi(RefusingWorkloadApi):
    calls = 0

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        return None


def test_the_refusal_backoff_runs_on_elapsed_time_not_on_calls() -> None:
    tj = queued(gpu_job())
    clock = [1000.0]
    api = CountingRefusingApi()
    kueue = KueueWorkloads(api, "cluster.local", clock=lambda: clock[0])  # type: ignore[arg-type]
    spec = parse(TrainingJobSpec, tj["spec"])
    first = kueue.gate("ns/j", tj, spec, "q")
    assert first.refused and first.retry_after == 2.0 and api.calls == 1
    clock[0] += 0.5
    for _ in range(5):  # enqueued by the watch, say: none of these asks the API, nor grows the wait
        early = kueue.gate("ns/j", tj, spec, "q")
        assert early.refused and early.retry_after == 1.5
    assert api.calls == 1
    clock[0] += 1.5
    later = kueue.gate("ns/j", tj, spec, "q")
    assert api.calls == 2 and later.retry_after == 4.0


def test_a_gang_that_failed_as_kueue_evicts_it_ends_failed_not_requeued() -> None:
    # Kueue looks at Finished before Evicted: a failure that came first is the job's outcome.
    gate = evicted_by("Preempted", "Preempted to accommodate a workload")
    pods = [pod(0, phase="Failed", exit_code=1), pod(1)]
    plan = decide(gpu_job(status=dict(RUNNING_UNDER_KUEUE)), pods, NODES, NOW, kueue_gate=gate)
    assert plan.status["phase"] == "Failed" and plan.delete_pods == ["j-worker-1"]
    assert plan.status["restarts"]["preemptions"] == 0 and plan.status["attempt"] == 0


def test_no_placement_is_given_while_its_error_stands_so_no_replacement_pod_goes_out_bare() -> None:
    # A started gang goes on past the rule; a replacement pod must not be made without its flavor's
    # nodeSelector and tolerations (controller/reconciler.py _create_gang asks placement()).
    kueue, gate = admitted_gate({})
    assert gate.placement_error
    with pytest.raises(PlacementUnavailable, match="ResourceFlavor h100"):
        kueue.placement(gate)
