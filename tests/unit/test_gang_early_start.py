"""Early start (gang/early_start.py): a blocked head whose nodes' work ends within the lead is
admitted onto them at once; what ends, what stays, and what plan_admission does with it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from phalanx.gang.admission import GangRequest, plan_admission
from phalanx.gang.early_start import (
    EARLY_START_SECONDS,
    EarlyStart,
    PodOnNode,
    end_for_early_start,
    node_handovers,
)
from tests.unit.test_gang_admission import gang, gpu_node

pytestmark = pytest.mark.unit

NOW = 1000.0
GPU = "nvidia.com/gpu"


def gpus(count: int) -> dict[str, int]:
    return {GPU: count * 1000}


def running(node: str, job: str | None, count: int = 8, priority: int = 0, bound: bool = True) -> PodOnNode:
    return PodOnNode(node, job, bound, gpus(count), priority)


def test_bound_pods_of_jobs_with_an_end_end_and_everything_else_stays() -> None:
    ends = {"ns/soon": NOW + 1, "ns/later": NOW + 30, "ns/unknown": math.inf, "ns/overdue": NOW - 10}
    handovers = node_handovers(
        [
            running("n0", "ns/soon", 4),
            running("n0", "ns/later", 2),
            running("n1", "ns/unknown", 4),
            running("n1", None, 1),  # another owner's pod
            running("n2", "ns/soon", 4, bound=False),  # admitted, not bound yet: it will run there
            running("n3", "ns/overdue", 8),
        ],
        ends,
        NOW,
    )
    assert handovers["n0"].ends_at == NOW + 30 and handovers["n0"].stays == {}
    assert handovers["n1"].ends_at == -math.inf and handovers["n1"].stays == gpus(5)
    assert handovers["n2"].stays == gpus(4)
    assert handovers["n3"].stays == gpus(8), "an estimate long past is no estimate"


def test_a_job_a_little_past_its_estimate_still_ends() -> None:
    # status.startTime has whole seconds: a hinted end can read up to a second early.
    handovers = node_handovers([running("n0", "ns/a")], {"ns/a": NOW - 0.5}, NOW)
    assert handovers["n0"].stays == {} and handovers["n0"].ends_at == NOW - 0.5
    assert EarlyStart(handovers).start(["n0"], NOW) == NOW


def test_room_is_given_only_within_the_lead() -> None:
    handovers = node_handovers([running("n0", "ns/a")], {"ns/a": NOW + EARLY_START_SECONDS + 1}, NOW)
    early = EarlyStart(handovers)
    allocatable = {"n0": gpus(8)}
    assert early.room(["n0"], allocatable, {}, 0, NOW) is None
    assert early.recheck_at(["n0"], NOW) == pytest.approx(NOW + 1)
    assert early.room(["n0"], allocatable, {}, 0, NOW + 1) == {"n0": gpus(8)}
    assert early.recheck_at(["n0"], NOW + 1) is None


def test_room_leaves_out_what_stays_and_what_this_pass_placed() -> None:
    handovers = node_handovers([running("n0", "ns/a", 4), running("n0", None, 1)], {"ns/a": NOW + 1}, NOW)
    room = EarlyStart(handovers).room(["n0"], {"n0": gpus(8)}, {"n0": (gpus(2), 0)}, 0, NOW)
    assert room == {"n0": gpus(5)}


def test_no_early_start_over_a_pod_of_lower_priority_bound_or_about_to_be() -> None:
    # The scheduler would preempt it to bind the waiting pod at once; a pod admitted and not bound
    # yet, or placed by this very pass, binds within moments.
    allocatable = {"n0": gpus(8)}
    for pods in ([running("n0", "ns/a", priority=0)],
                 [running("n0", "ns/a", 4, priority=10), running("n0", "ns/b", 4, priority=0, bound=False)]):  # fmt: skip
        early = EarlyStart(node_handovers(pods, {"ns/a": NOW + 1}, NOW))
        assert early.room(["n0"], allocatable, {}, 10, NOW) is None
        assert early.room(["n0"], allocatable, {}, 0, NOW) is not None
    alone = EarlyStart(node_handovers([running("n0", "ns/a", 4, priority=10)], {"ns/a": NOW + 1}, NOW))
    assert alone.room(["n0"], allocatable, {"n0": (gpus(2), 0)}, 10, NOW) is None


def test_an_unknown_end_is_never_waited_for() -> None:
    early = EarlyStart(node_handovers([running("n0", "ns/a")], {}, NOW))
    assert early.recheck_at(["n0"], NOW) is None


def test_an_eta_counts_only_as_read_at_a_known_time_else_the_stated_run_time() -> None:
    running_job = {"phase": "Running", "progress": {"etaSeconds": 5}}
    assert end_for_early_start(running_job, NOW - 1, NOW + 20) == NOW + 4
    # status.progress has no time: its ETA may be minutes old and would never run out.
    assert end_for_early_start(running_job, None, NOW + 20) == NOW + 20
    assert end_for_early_start(running_job, None, None) == math.inf
    assert end_for_early_start({**running_job, "phase": "Admitted"}, NOW, NOW + 20) == math.inf


def two_full_nodes_ending(at: float) -> tuple[list, dict[str, dict[str, int]], Callable[..., EarlyStart]]:
    nodes = [gpu_node("n0"), gpu_node("n1")]
    used = {"n0": gpus(8), "n1": gpus(8)}
    early = EarlyStart(node_handovers([running("n0", "ns/a"), running("n1", "ns/b")],
                                      {"ns/a": at, "ns/b": at}, NOW))  # fmt: skip
    return nodes, used, lambda held: early


def test_a_head_whose_nodes_free_within_the_lead_is_admitted_onto_them() -> None:
    nodes, used, early = two_full_nodes_ending(NOW + 1)
    plan = plan_admission([gang("head", 2, 8)], nodes, used, NOW, early=early)
    assert [a.key for a in plan.admitted] == ["head"]
    assert sorted(node for _, node in plan.admitted[0].placements) == ["n0", "n1"]
    assert not plan.waiting and not plan.reservations


def test_a_head_whose_nodes_free_later_waits_and_asks_for_a_pass_then() -> None:
    nodes, used, early = two_full_nodes_ending(NOW + 10)
    plan = plan_admission([gang("head", 2, 8)], nodes, used, NOW, early=early)
    assert not plan.admitted and "head" in plan.waiting
    assert plan.recheck_at == pytest.approx(NOW + 10 - EARLY_START_SECONDS)


def test_without_early_start_the_head_waits_for_the_room() -> None:
    nodes, used, _ = two_full_nodes_ending(NOW + 1)
    plan = plan_admission([gang("head", 2, 8)], nodes, used, NOW)
    assert not plan.admitted and plan.recheck_at is None


def test_two_heads_in_one_pass_never_share_the_room_that_frees() -> None:
    nodes, used, early = two_full_nodes_ending(NOW + 1)
    plan = plan_admission([gang("a", 1, 8, created=0.0), gang("b", 1, 8, created=1.0),
                           gang("c", 1, 8, created=2.0)], nodes, used, NOW, early=early)  # fmt: skip
    placed = [node for a in plan.admitted for _, node in a.placements]
    assert [a.key for a in plan.admitted] == ["a", "b"]
    assert sorted(placed) == ["n0", "n1"], "each freed node went to one gang"
    assert "c" in plan.waiting


def test_a_head_holds_a_full_node_before_one_given_early_to_another() -> None:
    # n0 runs a job and holds a gang started early there (more than it has); n1 runs a job. Both
    # are full; the head should not wait behind the gang that will then run on n0.
    nodes = [gpu_node("n0"), gpu_node("n1")]
    plan = plan_admission([gang("head", 1, 8)], nodes, {"n0": gpus(16), "n1": gpus(8)}, NOW)
    assert plan.reservations == {"head": ("n1",)}


def test_the_guard_reads_the_priority_the_scheduler_sees_on_the_pods() -> None:
    # A default PriorityClass: the job names none (priority 0 to the operator), its pods run at 1000.
    nodes, used, _ = two_full_nodes_ending(NOW + 1)
    early = EarlyStart(node_handovers([running("n0", "ns/a", priority=500), running("n1", "ns/b", priority=500)],
                                      {"ns/a": NOW + 1, "ns/b": NOW + 1}, NOW))  # fmt: skip
    head: GangRequest = replace(gang("head", 2, 8), pod_priority=1000)
    assert not plan_admission([head], nodes, used, NOW, early=lambda held: early).admitted
    same = replace(head, pod_priority=500)
    assert [a.key for a in plan_admission([same], nodes, used, NOW, early=lambda held: early).admitted] == [
        "head"
    ]


# -- the admission pass's side (controller/admission_pass.py): what it reads from its stores -----
START = 1767225600.0  # 2026-01-01T00:00:00Z


def pass_over(job_status: dict[str, object], now: float) -> EarlyStart:
    """An AdmissionPass over stores holding one job with expectedRunSeconds 20, a bound pod of it on
    n0, a creates in flight on n0 and a pod of another owner on n1; its early start outlook."""
    from phalanx.controller.admission_pass import AdmissionPass
    from phalanx.controller.admission_state import AdmissionState
    from phalanx.controller.stores import ClusterStores

    stores = ClusterStores()
    job = {"metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
           "spec": {"replicas": 1, "scheduling": {"expectedRunSeconds": 20}}, "status": job_status}  # fmt: skip
    stores.jobs.upsert(job)

    def pod(name: str, node: str, labels: dict[str, str], priority: int) -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1", "labels": labels},
                "spec": {"nodeName": node, "priority": priority,
                         "containers": [{"name": "c", "resources": {"requests": {GPU: "4"}}}]},
                "status": {"phase": "Running"}}  # fmt: skip

    stores.pods.upsert(pod("a-0", "n0", {"phalanx.dev/job-name": "a"}, 5))
    stores.pods.upsert(pod("daemon", "n1", {}, 7))
    state = AdmissionState()
    state.assumed["ns/b-0"] = ("n0", ((GPU, 2000),))
    passing = AdmissionPass(None, stores, state, None, None, None, None, time.time)  # type: ignore[arg-type]
    return passing._early_start(state, now)(["n0", "n1"])


def test_the_pass_reads_a_first_attempts_stated_run_time_and_what_stays() -> None:
    outlook = pass_over({"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}, START + 19)
    n0, n1 = outlook.handovers["n0"], outlook.handovers["n1"]
    assert n0.ends_at == START + 20 and n0.stays == gpus(2), "the job's pod ends; the create in flight stays"
    assert n0.lowest_priority is not None and n0.lowest_priority < 0, "a create in flight: priority unknown"
    assert n1.ends_at == -math.inf and n1.stays[GPU] == 4000 and n1.lowest_priority == 7
    assert outlook.room(["n0"], {"n0": gpus(8)}, {}, -(2**31), START + 19) == {"n0": gpus(6)}


def test_the_pass_trusts_a_stated_run_time_only_in_a_first_attempt() -> None:
    from phalanx.controller.admission_pass import AdmissionPass
    from phalanx.controller.stores import ClusterStores

    def end(status: dict[str, object]) -> float:
        job = {"metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
               "spec": {"scheduling": {"expectedRunSeconds": 20}}, "status": status}  # fmt: skip
        passing = AdmissionPass(None, ClusterStores(), None, None, None, None, None, lambda: NOW)  # type: ignore[arg-type]
        return passing._work_end(job)

    first = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
    assert end(first) == START + 20
    assert end({**first, "attempt": 1}) == math.inf  # startTime stays from the first attempt
    assert end({**first, "restarts": {"failures": 0, "preemptions": 0, "hangs": 1}}) == math.inf


def test_a_finishing_gang_is_guarded_with_its_pods_priority_not_its_lifted_order() -> None:
    nodes, used, early = two_full_nodes_ending(NOW + 1)
    finishing = replace(gang("head", 2, 8, priority=2**40), pod_priority=0)  # pods run at 0, like the job's
    assert [a.key for a in plan_admission([finishing], nodes, used, NOW, early=early).admitted] == ["head"]


def test_the_preemptor_sees_the_room_the_plan_just_gave() -> None:
    from phalanx.controller.admission_pass import used_after

    nodes, used, early = two_full_nodes_ending(NOW + 1)
    head = gang("head", 2, 8)
    plan = plan_admission([head], nodes, used, NOW, early=early)
    after = used_after(used, plan)
    assert {node: amounts[GPU] for node, amounts in after.items()} == {"n0": 16000, "n1": 16000}
    assert used == {"n0": gpus(8), "n1": gpus(8)}, "not changed in place"


def test_the_pass_counts_a_trainers_eta_from_the_poll_that_first_read_it() -> None:
    from phalanx.controller.admission_pass import AdmissionPass
    from phalanx.controller.stores import ClusterStores

    job = {
        "metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
        "spec": {},
        "status": {"phase": "Running"},
    }
    passing = AdmissionPass(None, ClusterStores(), None, None, None, None, None, lambda: NOW)  # type: ignore[arg-type]
    assert passing._work_end(job) == math.inf  # nothing read: the status' ETA has no time
    passing.read_progress = lambda key, uid: ({"etaSeconds": 30}, NOW - 10) if uid == "u1" else None
    assert passing._work_end(job) == NOW + 20


def test_the_pass_reads_when_nodes_free_from_stated_run_times_and_leaves_agents_out() -> None:
    # What the backfill and the head's reservation read (admission_pass._free_at): a job with no ETA
    # ends by its stated run time, as early start reads it; a node's agents (cpu only) stay beside.
    from phalanx.controller.admission_pass import AdmissionPass
    from phalanx.controller.admission_state import AdmissionState
    from phalanx.controller.stores import ClusterStores

    stores = ClusterStores()
    job = {"metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
           "spec": {"replicas": 1, "scheduling": {"expectedRunSeconds": 20}},
           "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}}  # fmt: skip
    stores.jobs.upsert(job)

    def pod(
        name: str, node: str, labels: dict[str, str], requests: dict[str, str], owner: str = ""
    ) -> dict[str, object]:
        owners = [{"kind": owner, "name": "x", "uid": "o", "controller": True}] if owner else []
        return {"metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1", "labels": labels,
                             "ownerReferences": owners},
                "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": requests}}]},
                "status": {"phase": "Running"}}  # fmt: skip

    stores.pods.upsert(pod("a-0", "n0", {"phalanx.dev/job-name": "a"}, {GPU: "8"}))
    stores.pods.upsert(pod("agent-n0", "n0", {}, {"cpu": "100m", "memory": "64Mi"}, owner="DaemonSet"))
    stores.pods.upsert(pod("static-n3", "n3", {}, {"cpu": "100m"}, owner="Node"))
    stores.pods.upsert(pod("someone-elses", "n1", {}, {GPU: "1"}))
    stores.pods.upsert(pod("a-deployments", "n4", {}, {"cpu": "2"}, owner="ReplicaSet"))
    state = AdmissionState()
    state.assumed["ns/b-0"] = ("n2", ((GPU, 2000),))
    passing = AdmissionPass(None, stores, state, None, None, None, None, time.time)  # type: ignore[arg-type]
    free_at = passing._free_at({"n0", "n1", "n2", "n3", "n4"}, state, START + 5)
    assert free_at == {"n0": START + 20, "n1": math.inf, "n2": math.inf, "n4": math.inf}
    # A trainer's ETA, once a poll has read it, counts over the stated run time.
    passing.read_progress = lambda key, uid: ({"etaSeconds": 40}, START + 5)
    assert passing._free_at({"n0"}, state, START + 5) == {"n0": START + 45}
