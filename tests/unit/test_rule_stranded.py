"""A gang admitted onto a node the scheduler will no longer bind to is torn down and queued again at
once, not after the gang timeout (reconcile/rules/stranded.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.builders.pods import admitted_pod
from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, job, not_ready_node, pod

pytestmark = pytest.mark.unit

ADMITTED = {"attempt": 0, "createdAttempt": 0, "phase": "Admitted", "admittedTime": iso(NOW - 30)}
REASON = "AdmittedNodeUnusable"


def pinned(index: int, node: str, tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Admitted onto `node`, not bound yet (as an early start leaves it while the node's work ends)."""
    spec: dict[str, Any] = {"nodeName": "", "schedulingGates": [{"name": "phalanx.dev/gang"}]}
    if tolerations:
        spec["tolerations"] = tolerations
    return admitted_pod(pod(index, phase="Pending", spec=spec), node)


def node(name: str, **spec: Any) -> dict[str, Any]:
    ready = {"type": "Ready", "status": "True"}
    return {"metadata": {"name": name}, "spec": spec, "status": {"conditions": [ready]}}


def assert_torn_down(plan: Any, why: str) -> None:
    assert plan.status["attempt"] == 1 and plan.status["phase"] == "Pending"
    assert set(plan.delete_pods) == {"j-worker-0", "j-worker-1"}
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 0}  # the node's fault, not the gang's
    assert "gangTimeouts" not in plan.status and "requeueAfter" not in plan.status  # no backoff
    assert why in plan.status["message"] and "j-worker-1 was admitted onto node n1" in plan.status["message"]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", REASON)]


def test_a_gang_admitted_onto_a_node_that_is_lost_is_queued_again_at_once() -> None:
    nodes = {**NODES, "n1": not_ready_node("n1", since=NOW - 21)}  # lost after 20 s
    plan = decide(job(dict(ADMITTED)), [pod(0), pinned(1, "n1")], nodes, NOW)
    assert_torn_down(plan, f"not Ready since {iso(NOW - 21)}")


def test_a_node_not_ready_for_less_than_the_lost_bound_is_waited_for_and_looked_at_again_then() -> None:
    nodes = {**NODES, "n1": not_ready_node("n1", since=NOW - 5)}
    plan = decide(job(dict(ADMITTED)), [pod(0), pinned(1, "n1")], nodes, NOW)
    assert plan.status["attempt"] == 0 and plan.delete_pods == [] and plan.status["phase"] == "Admitted"
    assert plan.recheck_after is not None and plan.recheck_after == pytest.approx(15, abs=0.01)


def test_a_gang_admitted_onto_a_node_that_no_longer_exists_is_queued_again() -> None:
    plan = decide(job(dict(ADMITTED)), [pod(0), pinned(1, "n1")], NODES, NOW)
    assert_torn_down(plan, "no longer exists")


def test_no_node_known_yet_is_not_a_vanished_node() -> None:
    plan = decide(job(dict(ADMITTED)), [pinned(0, "n0"), pinned(1, "n1")], {}, NOW)
    assert plan.status["attempt"] == 0 and plan.delete_pods == []


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (
            {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
            "being removed (the cluster autoscaler is removing it)",
        ),
        (
            {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
            "being removed (Karpenter is removing it)",
        ),
        (
            {"taints": [{"key": "nvidia.com/gpu-unhealthy", "value": "xid-79", "effect": "NoExecute"}]},
            "tainted nvidia.com/gpu-unhealthy=xid-79:NoExecute",
        ),
    ],
    ids=["autoscaler-removal", "karpenter-removal", "evicting-taint"],
)
def test_a_gang_admitted_onto_a_node_that_is_going_or_evicts_is_queued_again(
    spec: dict[str, Any], why: str
) -> None:
    plan = decide(job(dict(ADMITTED)), [pod(0), pinned(1, "n1")], {**NODES, "n1": node("n1", **spec)}, NOW)
    assert_torn_down(plan, why)


@pytest.mark.parametrize(
    ("spec", "labels"),
    [
        ({"unschedulable": True}, {}),  # a short maintenance cordon
        (
            {"taints": [{"key": "node.cilium.io/agent-not-ready", "effect": "NoSchedule"}]},
            {},
        ),  # an agent restarting
        ({"taints": [{"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}]}, {}),
        ({}, {"pool": "b"}),  # relabelled out of the pod's selector, perhaps for a moment
    ],
    ids=["cordoned", "no-schedule-taint", "condition-taint", "relabelled"],
)
def test_what_may_pass_is_left_to_the_gang_timeout(spec: dict[str, Any], labels: dict[str, str]) -> None:
    # Tearing down would restart the gang for nothing if it passes; the gang timeout still bounds it.
    pods = [pod(0), pinned(1, "n1")]
    pods[1]["spec"]["nodeSelector"] = {"pool": "a"}
    ready = node("n1", **spec)
    ready["metadata"]["labels"] = labels or {"pool": "a"}
    plan = decide(job(dict(ADMITTED)), pods, {**NODES, "n1": ready}, NOW)
    assert plan.status["attempt"] == 0 and plan.delete_pods == [] and plan.status["phase"] == "Admitted"


@pytest.mark.parametrize(
    ("spec", "tolerate"),
    [
        ({"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}, {"operator": "Exists"}),
        (
            {"taints": [{"key": "nvidia.com/gpu-unhealthy", "value": "xid-79", "effect": "NoExecute"}]},
            {"key": "nvidia.com/gpu-unhealthy", "operator": "Exists", "effect": "NoExecute"},
        ),
    ],
    ids=["every-taint-tolerated", "evicting-taint-tolerated"],
)
def test_a_pod_that_tolerates_what_the_node_says_still_binds_there_and_waits(
    spec: dict[str, Any], tolerate: dict[str, Any]
) -> None:
    pods = [pod(0), pinned(1, "n1", tolerations=[tolerate])]
    plan = decide(job(dict(ADMITTED)), pods, {**NODES, "n1": node("n1", **spec)}, NOW)
    assert plan.status["attempt"] == 0 and plan.delete_pods == []


def test_a_node_whose_evicting_taint_the_pod_tolerates_for_a_while_only_is_no_place_to_bind() -> None:
    # tolerationSeconds: bound there, the pod would be evicted once they pass, and the gang with it.
    spec = {"taints": [{"key": "nvidia.com/gpu-unhealthy", "value": "xid-79", "effect": "NoExecute"}]}
    for_a_while = {"key": "nvidia.com/gpu-unhealthy", "operator": "Exists", "effect": "NoExecute",
                   "tolerationSeconds": 300}  # fmt: skip
    pods = [pod(0), pinned(1, "n1", tolerations=[for_a_while])]
    plan = decide(job(dict(ADMITTED)), pods, {**NODES, "n1": node("n1", **spec)}, NOW)
    assert_torn_down(plan, "tainted nvidia.com/gpu-unhealthy=xid-79:NoExecute, tolerated for 300 s only")
    # As the taint manager reads them, the first toleration that matches decides: one for good after
    # it changes nothing; first, the pod stays there for good.
    for_good = {"key": "nvidia.com/gpu-unhealthy", "operator": "Exists", "effect": "NoExecute"}
    pods = [pod(0), pinned(1, "n1", tolerations=[for_a_while, for_good])]
    plan = decide(job(dict(ADMITTED)), pods, {**NODES, "n1": node("n1", **spec)}, NOW)
    assert_torn_down(plan, "tolerated for 300 s only")
    pods = [pod(0), pinned(1, "n1", tolerations=[for_good, for_a_while])]
    plan = decide(job(dict(ADMITTED)), pods, {**NODES, "n1": node("n1", **spec)}, NOW)
    assert plan.status["attempt"] == 0 and plan.delete_pods == []


def test_a_gang_admitted_onto_healthy_nodes_waits_for_the_scheduler() -> None:
    plan = decide(job(dict(ADMITTED)), [pod(0), pinned(1, "n1")], {**NODES, "n1": node("n1")}, NOW)
    assert plan.status["attempt"] == 0 and plan.delete_pods == [] and plan.status["phase"] == "Admitted"


def test_a_job_still_pending_when_its_node_is_lost_is_told_by_an_event_too() -> None:
    # The phase stays Pending, so the phase change says nothing: the teardown is news all the same.
    status = {**ADMITTED, "phase": "Pending"}
    nodes = {**NODES, "n1": not_ready_node("n1", since=NOW - 60)}
    plan = decide(job(status), [pinned(0, "n0"), pinned(1, "n1")], nodes, NOW)
    assert_torn_down(plan, "not Ready since")


def test_a_gang_kueue_admitted_is_kueues_to_undo() -> None:
    # Its pods are created ungated once the Workload is admitted: torn down, pods pinned the same way
    # (by the user's template or a flavor) would come back at once, over and over.
    from phalanx.kueue.gate import KueueGate

    admitted = KueueGate(workload="wl", admitted=True, evicted=False, message="", cluster_queue="cq")
    nodes = {**NODES, "n1": not_ready_node("n1", since=NOW - 60)}
    plan = decide(job(dict(ADMITTED)), [pod(0), pinned(1, "n1")], nodes, NOW, kueue_gate=admitted)
    assert plan.status["attempt"] == 0 and plan.delete_pods == []
    assert not any(e.reason == REASON for e in plan.events)


def test_an_external_scheduler_admits_and_places_its_own_gangs() -> None:
    nodes = {**NODES, "n1": not_ready_node("n1", since=NOW - 60)}
    plan = decide(
        job(dict(ADMITTED), scheduling={"provider": "volcano"}), [pod(0), pinned(1, "n1")], nodes, NOW
    )
    assert plan.status["attempt"] == 0 and plan.delete_pods == []


IN_PLACE_STATUS = {
    "attempt": 1, "phase": "Restarting", "restarts": {"failures": 0, "preemptions": 1},
    "inPlace": {"attempt": 1, "keptPods": [{"name": "j-worker-0", "uid": "p0-0"}], "time": iso(NOW - 5)},
    "lastRecovery": {"attempt": 1, "path": "InPlace", "phasesMilliseconds": {}},
    "admittedTime": iso(NOW - 3), "createdAttempt": 1,
}  # fmt: skip


def in_place_job(status: dict[str, Any]) -> dict[str, Any]:
    return job(status, runPolicy={"restartStrategy": "InPlace"})


def replacement(node_name: str, uid: str = "p1-1") -> dict[str, Any]:
    gated = {"nodeName": "", "schedulingGates": [{"name": "phalanx.dev/gang"}]}
    return admitted_pod(pod(1, 1, phase="Pending", spec=gated, metadata={"uid": uid}), node_name)


def test_a_replacement_of_an_in_place_restart_stranded_is_placed_again_alone_and_the_kept_pod_waits() -> None:
    # Restarting in place: worker-0 kept and running, worker-1's replacement admitted onto n1, which
    # is then lost. A full restart would throw the kept rank away: only the replacement goes (if still
    # unbound: a precondition) and its rank is created again, onto a node that takes pods.
    nodes = {**NODES, "n1": not_ready_node("n1", since=NOW - 60)}
    kept = pod(0, 0)
    plan = decide(in_place_job(dict(IN_PLACE_STATUS)), [kept, replacement("n1")], nodes, NOW)
    assert plan.status["attempt"] == 1 and plan.status["inPlace"]["attempt"] == 1
    assert plan.delete_pods == [] and plan.delete_unchanged_pods == ["j-worker-1"]
    assert plan.status["inPlace"]["replacedPods"] == [{"name": "j-worker-1", "uid": "p1-1"}]
    assert "createdAttempt" not in plan.status
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}
    [event] = [e for e in plan.events if e.reason == REASON]
    assert event.type == "Warning" and "j-worker-1" in event.message and "j-worker-0" in event.message

    # While it goes, nothing restarts; once it is gone, its rank is created again; the new pod
    # (another uid) is the attempt's, and the attempt runs on as attempt 1.
    leaving = replacement("n1")
    leaving["metadata"]["deletionTimestamp"] = iso(NOW)
    going = decide(in_place_job(dict(plan.status)), [kept, leaving], nodes, NOW + 1)
    assert going.status["attempt"] == 1 and going.delete_pods == [] and going.create_indices == []
    gone = decide(in_place_job(dict(going.status)), [kept], nodes, NOW + 2)
    assert gone.status["attempt"] == 1 and gone.create_indices == [1]
    created = decide(in_place_job(dict(gone.status)), [kept, replacement("n0", uid="p1-1b")], nodes, NOW + 3)
    assert created.status["attempt"] == 1 and created.status.get("createdAttempt") == 1
    assert created.delete_pods == [] and created.delete_unchanged_pods == []
    trained = [kept, pod(1, 1, metadata={"uid": "p1-1b"})]
    running = decide(in_place_job(dict(created.status)), trained, nodes, NOW + 4)
    assert running.status["attempt"] == 1 and running.status["phase"] == "Running"


def test_a_stranded_replacement_bound_before_its_deletion_stays_the_attempts_pod() -> None:
    # Its node came back and the scheduler bound it before the delete, whose precondition refused:
    # the pod runs where it was admitted and is the attempt's again; nothing is deleted or created.
    lost = {**NODES, "n1": not_ready_node("n1", since=NOW - 60)}
    plan = decide(in_place_job(dict(IN_PLACE_STATUS)), [pod(0, 0), replacement("n1")], lost, NOW)
    bound = replacement("n1")
    bound["spec"]["nodeName"] = "n1"
    back = {**NODES, "n1": node("n1")}
    after = decide(in_place_job(dict(plan.status)), [pod(0, 0), bound], back, NOW + 1)
    assert after.status["attempt"] == 1 and after.delete_pods == [] and after.create_indices == []
    assert after.delete_unchanged_pods == []


def test_replaced_pods_name_only_pods_that_still_exist() -> None:
    # A second stranding drops the first entry whose pod is gone: the list cannot grow without end.
    status = {**IN_PLACE_STATUS, "inPlace": {**IN_PLACE_STATUS["inPlace"],
              "replacedPods": [{"name": "j-worker-1", "uid": "gone-uid"}]}}  # fmt: skip
    nodes = {**NODES, "n1": not_ready_node("n1", since=NOW - 60)}
    plan = decide(in_place_job(status), [pod(0, 0), replacement("n1", uid="p1-1b")], nodes, NOW)
    assert plan.status["inPlace"]["replacedPods"] == [{"name": "j-worker-1", "uid": "p1-1b"}]
    assert "admittedTime" not in plan.status  # admitted again: the gang timeout counts from then
