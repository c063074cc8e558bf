"""Warm spares through decide() (reconcile/rules/spares.py, rules/in_place.py): created with the gang,
kept at spec.spares, a lost idle spare replaced without disturbing anyone, a spare taking a lost rank
in an in-place restart, and removed once the job no longer runs."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.kueue.gate import KueueGate
from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import Event, iso, merged_events
from phalanx.reconcile.rules.spares import KUEUE_IGNORED, WAITING_FOR_WORKERS, spares_refused
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job
from tests.unit.test_rule_in_place import evicted, resident

pytestmark = pytest.mark.unit

SPARES = {"runPolicy": {"restartStrategy": "InPlace", "backoffLimit": 2}, "spares": 1}
LAUNCHER = {"phalanx.dev/resident-launcher": "true"}


def spare(number: int, phase: str = "Running", attempt: int = 0, **metadata: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if phase == "Running":
        status["podIP"] = f"10.0.1.{number + 1}"
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    return {
        "metadata": {"name": f"j-spare-{number}", "uid": f"s{number}", "annotations": LAUNCHER,
                     "labels": {"phalanx.dev/spare": "true", "phalanx.dev/attempt": str(attempt)}, **metadata},
        "spec": {"nodeName": "n0"},
        "status": status,
    }  # fmt: skip


def gated(index: int, attempt: int = 0) -> dict[str, Any]:
    waiting = resident(
        index, attempt, phase="Pending", spec={"schedulingGates": [{"name": "phalanx.dev/gang"}]}
    )
    del waiting["spec"]["nodeName"]
    return waiting


def took_rank_1(status: dict[str, Any] | None = None) -> dict[str, Any]:
    """The status after spare 0 was told to take worker-1's rank (attempt 1 in place)."""
    kept = [{"name": "j-worker-0", "uid": "p0-0"}, {"name": "j-spare-0", "uid": "s0", "rank": 1}]
    return {
        **RUNNING,
        "attempt": 1,
        "phase": "Restarting",
        "restarts": {"failures": 0, "preemptions": 1},
        "inPlace": {"attempt": 1, "keptPods": kept, "time": iso(NOW - 5), "stop": "checkpoint"},
        **(status or {}),
    }


def test_a_new_gang_creates_its_workers_and_its_spares_only_once_they_are_admitted() -> None:
    # Spares are best effort: never created with (nor admitted before) the workers.
    plan = decide(job(None, **SPARES), [], NODES, NOW)
    assert plan.create_indices == [0, 1] and plan.create_spares == []
    assert plan.status["spares"]["summary"] == "0/1" and plan.status["spares"]["pods"] == []
    pending = {**RUNNING, "phase": "Pending"}
    plan = decide(job(pending, **SPARES), [gated(0), gated(1)], NODES, NOW)
    assert plan.create_spares == [] and plan.status["spares"]["message"] == WAITING_FOR_WORKERS
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1)], NODES, NOW)
    assert plan.create_spares == [0] and "message" not in plan.status["spares"]


def test_a_gang_waiting_at_the_gate_keeps_no_spare() -> None:
    # Its spares would hold GPUs for a gang that holds none (a full restart queued, say).
    status = {**RUNNING, "attempt": 1, "createdAttempt": 1, "phase": "Restarting"}
    plan = decide(job(status, **SPARES), [gated(0, 1), gated(1, 1), spare(0)], NODES, NOW)
    assert plan.delete_pods == ["j-spare-0"] and plan.create_spares == []
    assert plan.status["spares"]["pods"] == [] and plan.status["spares"]["ready"] == 0


def test_a_gang_in_its_gang_timeout_backoff_keeps_no_spare() -> None:
    status = {**RUNNING, "phase": "Pending", "createdAttempt": None}
    plan = decide(job(status, **SPARES), [spare(0)], NODES, NOW)
    assert "j-spare-0" in plan.delete_pods and plan.create_spares == []


def test_spares_created_alone_keep_off_bad_nodes() -> None:
    bad = [{"node": "n9", "failures": 2, "lastFailureTime": iso(NOW - 10), "avoidedUntil": iso(NOW + 600)}]
    plan = decide(job({**RUNNING, "badNodes": bad}, **SPARES), [resident(0), resident(1)], NODES, NOW)
    assert plan.create_spares == [0] and plan.avoid_nodes == ["n9"]


def test_a_spare_lost_again_and_again_is_replaced_with_a_backoff() -> None:
    lost = spare(0, phase="Failed")
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1), lost], NODES, NOW)
    assert plan.create_spares == [1] and plan.status["spares"]["failures"] == 1
    assert plan.status["spares"]["nextCreateTime"] == iso(NOW + 5)
    # The new one fails too, a second later: no spare is created before the backoff is over.
    status = {**plan.status}
    plan = decide(job(status, **SPARES), [resident(0), resident(1), spare(1, phase="Failed")], NODES, NOW + 1)
    assert plan.create_spares == [] and plan.delete_pods == ["j-spare-1"]
    assert plan.recheck_after is not None and plan.recheck_after <= 4
    plan = decide(job(status, **SPARES), [resident(0), resident(1), spare(1, phase="Failed")], NODES, NOW + 6)
    assert plan.create_spares == [0] and plan.status["spares"]["failures"] == 2
    assert plan.status["spares"]["nextCreateTime"] == iso(NOW + 6 + 10)
    # All ready again: the backoff is forgotten.
    plan = decide(job(dict(plan.status), **SPARES), [resident(0), resident(1), spare(0)], NODES, NOW + 60)
    assert "failures" not in plan.status["spares"] and "nextCreateTime" not in plan.status["spares"]


def test_a_refused_spare_is_said_in_status_spares_not_in_pods_created() -> None:
    status: dict[str, Any] = {**RUNNING, "spares": {"desired": 1, "ready": 0, "summary": "0/1", "pods": []}}
    event = spares_refused({}, status, ['pods "j-spare-0" is forbidden: exceeded quota'], NOW)
    assert event is not None and (event.type, event.reason) == ("Warning", "SparesRefused")
    assert (
        status["spares"]["message"]
        == '1 spare(s) refused by the API server: pods "j-spare-0" is forbidden: exceeded quota'
    )
    assert status["spares"]["nextCreateTime"] == iso(NOW + 5) and "conditions" not in status
    assert (
        spares_refused(
            {"spares": dict(status["spares"])}, status, ['pods "j-spare-0" is forbidden: exceeded quota'], NOW
        )
        is None
    )
    # The next passes keep saying so, and wait for the backoff.
    plan = decide(job(status, **SPARES), [resident(0), resident(1)], NODES, NOW + 1)
    assert plan.create_spares == [] and "refused" in plan.status["spares"]["message"]


def test_the_takeover_pass_writes_status_spares_without_the_spare_taking_the_rank() -> None:
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), evicted(1), spare(0)], NODES, NOW)
    assert plan.status["spares"]["pods"] == [] and plan.status["spares"]["ready"] == 0


def test_without_spares_nothing_changes() -> None:
    plan = decide(job(None, runPolicy={"restartStrategy": "InPlace"}), [], NODES, NOW)
    assert plan.create_spares == [] and "spares" not in plan.status


def test_a_running_gang_with_its_spare_is_left_alone() -> None:
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1), spare(0)], NODES, NOW)
    assert plan.create_spares == [] and plan.delete_pods == [] and plan.create_indices == []
    assert plan.status["spares"]["summary"] == "1/1" and plan.status["phase"] == "Running"


def test_an_idle_spare_evicted_is_replaced_and_nobody_else_is_disturbed() -> None:
    going = spare(0, deletionTimestamp=iso(NOW - 1))
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1), going], NODES, NOW)
    assert plan.create_spares == [1]  # a new name: the lost one holds its own while it goes
    assert plan.delete_pods == [] and plan.create_indices == []
    assert plan.status["attempt"] == 0 and plan.status["restarts"] == {"failures": 0, "preemptions": 0}
    assert plan.status["phase"] == "Running" and "inPlace" not in plan.status
    [event] = plan.events
    assert (event.type, event.reason) == ("Normal", "SpareReplaced") and "j-spare-0" in event.message
    # Never merged into another Normal event of the same pass, which would keep only the last reason.
    others = [
        Event("Normal", "Created", "created"),
        Event("Normal", "AllWorkersRunning", "all 2 pod(s) running"),
    ]
    assert event in merged_events([others[0], event, others[1]])


def test_an_idle_spare_that_ended_is_deleted_and_replaced() -> None:
    plan = decide(
        job(dict(RUNNING), **SPARES), [resident(0), resident(1), spare(0, phase="Failed")], NODES, NOW
    )
    assert plan.delete_pods == ["j-spare-0"] and plan.create_spares == [1]
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 0}


def test_a_spare_created_in_an_earlier_attempt_is_no_stale_pod() -> None:
    status = {**RUNNING, "attempt": 3, "createdAttempt": 3}
    pods = [resident(0, 3), resident(1, 3), spare(0, attempt=0)]
    plan = decide(job(status, **SPARES), pods, NODES, NOW)
    assert plan.delete_pods == [] and plan.create_spares == [] and plan.status["phase"] == "Running"


def test_a_ready_spare_takes_the_lost_rank_and_no_pod_is_created_for_it() -> None:
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), evicted(1), spare(0)], NODES, NOW)
    assert plan.status["attempt"] == 1 and plan.status["restarts"] == {"failures": 0, "preemptions": 1}
    assert plan.status["inPlace"]["keptPods"] == [
        {"name": "j-worker-0", "uid": "p0-0"},
        {"name": "j-spare-0", "uid": "s0", "rank": 1},
    ]
    assert plan.delete_pods == ["j-worker-1"]  # the lost pod goes; worker-0 and the spare stay
    assert plan.create_indices == [] and plan.relabel_pods == {"j-spare-0": 1}
    assert "keeping j-worker-0, spare j-spare-0 takes rank 1" in plan.status["message"]
    assert plan.status["lastRecovery"]["path"] == "InPlaceSpare"


def test_after_the_takeover_the_spare_is_rank_1_and_a_new_spare_is_created_in_the_background() -> None:
    pods = [resident(0), spare(0)]  # worker-1 gone; the spare not relabelled yet
    plan = decide(job(took_rank_1(), **SPARES), pods, NODES, NOW)
    assert plan.create_indices == [] and plan.delete_pods == []
    assert plan.create_spares == [1] and plan.relabel_pods == {"j-spare-0": 1}
    assert plan.status["phase"] == "Running" and plan.status["replicas"]["active"] == 2


def test_a_relabelled_spare_is_its_ranks_worker_until_a_full_restart_replaces_it() -> None:
    relabelled = spare(0)
    relabelled["metadata"]["labels"] = {"phalanx.dev/replica-index": "1", "phalanx.dev/attempt": "0"}
    plan = decide(job(took_rank_1(), **SPARES), [resident(0), relabelled, spare(1)], NODES, NOW)
    assert plan.create_indices == [] and plan.relabel_pods == {} and plan.create_spares == []
    assert plan.status["phase"] == "Running"
    # A later full restart: it is an older attempt's pod like any other.
    status = {**RUNNING, "attempt": 2, "restarts": {"failures": 0, "preemptions": 2}}
    plan = decide(job(status, **SPARES), [resident(0), relabelled, spare(1)], NODES, NOW)
    # The gang waits for its new attempt: its idle spare goes too, and is created again once admitted.
    assert sorted(plan.delete_pods) == ["j-spare-0", "j-spare-1", "j-worker-0"]


def test_without_a_ready_spare_the_lost_rank_is_replaced_as_before() -> None:
    starting = spare(0, phase="Pending")
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), evicted(1), starting], NODES, NOW)
    assert plan.status["inPlace"]["keptPods"] == [{"name": "j-worker-0", "uid": "p0-0"}]
    assert "replacing worker-1" in plan.status["message"] and plan.relabel_pods == {}
    assert plan.status["lastRecovery"]["path"] == "InPlace"


def test_rank_0_lost_falls_back_to_a_full_restart_without_the_spares() -> None:
    plan = decide(job(dict(RUNNING), **SPARES), [evicted(0), resident(1), spare(0)], NODES, NOW)
    assert "inPlace" not in plan.status
    assert sorted(plan.delete_pods) == ["j-spare-0", "j-worker-0", "j-worker-1"]
    assert [e.reason for e in plan.events if e.reason == "InPlaceFallback"] == ["InPlaceFallback"]
    # The next attempt waits for the old workers only, not for the spare.
    status = {**plan.status, "phase": "Restarting"}
    going = [evicted(0), resident(1, metadata={"deletionTimestamp": iso(NOW)}), spare(0)]
    plan = decide(job(status, **SPARES), going, NODES, NOW)
    assert plan.status["message"] == "waiting for 2 pod(s) of the previous attempt to stop"
    assert plan.create_spares == []


def test_a_finished_or_suspended_job_keeps_no_spare() -> None:
    done = {**RUNNING, "phase": "Succeeded", "completionTime": iso(NOW)}
    finished = [resident(0, phase="Succeeded"), resident(1, phase="Succeeded"), spare(0)]
    plan = decide(job(done, **SPARES), finished, NODES, NOW)
    assert plan.delete_pods == ["j-spare-0"] and plan.create_spares == []
    suspended = {**SPARES, "runPolicy": {**SPARES["runPolicy"], "suspend": True}}
    plan = decide(job(dict(RUNNING), **suspended), [resident(0), resident(1), spare(0)], NODES, NOW)
    assert sorted(plan.delete_pods) == ["j-spare-0", "j-worker-0", "j-worker-1"] and plan.create_spares == []


def test_fewer_spares_asked_for_removes_the_surplus() -> None:
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1), spare(0), spare(1)], NODES, NOW)
    assert plan.delete_pods == ["j-spare-1"] and [e.reason for e in plan.events] == ["SparesRemoved"]


def test_a_spare_whose_launcher_refuses_the_rank_falls_back_to_a_full_restart() -> None:
    status = took_rank_1({"lastRecovery": {"attempt": 1, "phasesMilliseconds": {}}})
    plan = decide(job(status, **SPARES), [resident(0), spare(0)], NODES, NOW,
                  launcher_refusals={"j-spare-0": "unreachable at 10.0.1.1:9399"})  # fmt: skip
    assert plan.status["attempt"] == 2 and "inPlace" not in plan.status
    assert sorted(plan.delete_pods) == ["j-spare-0", "j-worker-0"]  # the spare had become rank 1's pod
    [fallback] = [e for e in plan.events if e.reason == "InPlaceFallback"]
    assert "the launcher of j-spare-0 did not take the generation" in fallback.message
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}  # the disruption counted once


def test_a_kueue_queued_job_gets_no_spares_kueue_admits_the_workers_pod_set_only() -> None:
    admitted = KueueGate(workload="wl", admitted=True, evicted=False, message="", cluster_queue="cq")
    plan = decide(job(None, **SPARES), [], NODES, NOW, kueue_gate=admitted)
    assert plan.create_indices == [0, 1] and plan.create_spares == []


def test_spares_under_kueue_are_ignored_with_one_warning() -> None:
    admitted = KueueGate(workload="wl", admitted=True, evicted=False, message="", cluster_queue="cq")
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1)], NODES, NOW, kueue_gate=admitted)
    assert plan.create_spares == [] and plan.status["spares"]["message"] == KUEUE_IGNORED
    assert [(e.type, e.reason) for e in plan.events if e.reason == "SparesIgnored"] == [
        ("Warning", "SparesIgnored")
    ]
    again = decide(
        job(dict(plan.status), **SPARES), [resident(0), resident(1)], NODES, NOW, kueue_gate=admitted
    )
    assert [e for e in again.events if e.reason == "SparesIgnored"] == []


def test_a_worker_being_deleted_does_not_cost_the_gang_its_spare() -> None:
    # Its grace period is when a spare is needed most: it takes the rank, or stays for the next loss.
    going = resident(1, metadata={"deletionTimestamp": iso(NOW - 1)})
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), going, spare(0)], NODES, NOW)
    assert "j-spare-0" not in plan.delete_pods


def test_a_spare_gone_before_the_operator_saw_it_go_is_replaced_and_said_so() -> None:
    # On a real node an idle spare's launcher exits at once on SIGTERM: its pod may be gone before a
    # pass sees it deleting. Its number is free again.
    stood_by = {**RUNNING, "spares": {"desired": 1, "ready": 1, "summary": "1/1", "pods": ["j-spare-0"]}}
    plan = decide(job(stood_by, **SPARES), [resident(0), resident(1)], NODES, NOW)
    assert plan.create_spares == [0] and plan.status["restarts"] == {"failures": 0, "preemptions": 0}
    [event] = plan.events
    assert (event.type, event.reason) == ("Normal", "SpareReplaced")
    assert event.message == (
        "creating spare(s) j-spare-0 (0 of spec.spares=1 standing by); training goes on undisturbed"
    )


def test_the_spare_created_after_a_takeover_says_which_took_a_rank() -> None:
    plan = decide(job(took_rank_1(), **SPARES), [resident(0), spare(0)], NODES, NOW)
    [event] = [e for e in plan.events if e.reason == "SpareReplaced"]
    assert (
        event.message == "creating spare(s) j-spare-1 (j-spare-0 took rank 1); training goes on undisturbed"
    )


def test_a_gang_torn_down_after_its_timeout_lets_its_spares_go_too_until_it_is_created_again() -> None:
    backing_off = {**RUNNING, "phase": "Pending", "requeueAfter": iso(NOW + 30), "gangTimeouts": 1}
    plan = decide(job(backing_off, **SPARES), [spare(0)], NODES, NOW)
    assert plan.delete_pods == ["j-spare-0"] and plan.create_spares == [] and plan.create_indices == []
    requeued = {"attempt": 1, "phase": "Pending", "requeueAfter": iso(NOW - 1), "gangTimeouts": 1}
    plan = decide(job(requeued, **SPARES), [], NODES, NOW)
    # The workers first; their spares once they are admitted (best effort, gang/requests.py).
    assert plan.create_indices == [0, 1] and plan.create_spares == []


def test_a_spare_standing_by_is_booked_as_standby_in_goodput_and_one_taking_a_rank_is_not() -> None:
    ledger = {"unit": "pod", "devices": "2", "accountedTime": iso(NOW - 100)}
    running = {**RUNNING, "attempt": 1, "createdAttempt": 1, "goodput": ledger}
    standing_by = job(running, **SPARES)
    standing_by["metadata"]["creationTimestamp"] = iso(NOW - 100)
    plan = decide(standing_by, [resident(0, 1), resident(1, 1), spare(0)], NODES, NOW)
    booked = plan.status["goodput"]
    assert booked["standbySparesSeconds"] == 100, "one spare's device for 100 s"
    assert booked["productiveSeconds"] == 200 and booked["allocatedSeconds"] == 300
    taking = job(took_rank_1({"goodput": ledger}), **SPARES)
    taking["metadata"]["creationTimestamp"] = iso(NOW - 100)
    plan = decide(taking, [resident(0, 0), spare(0)], NODES, NOW)
    booked = plan.status["goodput"]
    assert booked["allocatedSeconds"] == 200, "booked: the gang's 2 devices for 100 s, no more"
    assert booked["standbySparesSeconds"] == 0, "a spare taking a rank is a worker"


YIELD = {"s0": "gave its room to ns/head (priority 0), waiting for it"}  # spare(0)'s uid


def test_a_spare_asked_to_yield_is_deleted_by_its_jobs_reconcile_and_nothing_else_moves() -> None:
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1), spare(0)], NODES, NOW,
                  yielding_spares=YIELD)  # fmt: skip
    assert plan.delete_pods == ["j-spare-0"] and plan.create_indices == []
    assert plan.status["phase"] == "Running" and plan.status["attempt"] == 0
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 0}
    [event] = [e for e in plan.events if e.reason == "SparePreempted"]
    assert event.type == "Normal" and "ns/head" in event.message and "undisturbed" in event.message


def test_a_spare_that_yielded_is_replaced_after_a_delay_set_when_it_is_deleted_with_no_failure_booked() -> (
    None
):
    # An old nextCreateTime in the past (a spare made after an earlier backoff) must not cancel the delay.
    old_spares = {"desired": 1, "nextCreateTime": iso(NOW - 100)}
    plan = decide(job({**RUNNING, "spares": old_spares}, **SPARES), [resident(0), resident(1), spare(0)], NODES,
                  NOW, yielding_spares=YIELD)  # fmt: skip
    assert plan.delete_pods == ["j-spare-0"]
    assert (
        plan.status["spares"]["nextCreateTime"] == iso(NOW + 60) and "failures" not in plan.status["spares"]
    )
    going = spare(0, deletionTimestamp=iso(NOW + 30))
    for at in (NOW + 10, NOW + 59):  # terminating, then gone: either way not replaced yet, never pushed later
        pods = [resident(0), resident(1), going] if at < NOW + 30 else [resident(0), resident(1)]
        later = decide(job({**RUNNING, "spares": plan.status["spares"]}, **SPARES), pods, NODES, at,
                       yielding_spares=YIELD)  # fmt: skip
        assert later.create_spares == [] and later.status["spares"]["nextCreateTime"] == iso(NOW + 60)
        assert "failures" not in later.status["spares"]
    plan = decide(job({**RUNNING, "spares": plan.status["spares"]}, **SPARES), [resident(0), resident(1), going],
                  NODES, NOW + 61, yielding_spares=YIELD)  # fmt: skip
    assert plan.create_spares == [1] and "failures" not in plan.status["spares"]
    [event] = [e for e in plan.events if e.reason == "SpareReplaced"]
    assert "gave its room to a waiting gang" in event.message and "lost" not in event.message
    # The same loss not asked for is a failing spare: replaced at once, the backoff starts.
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1), going], NODES, NOW)
    assert plan.create_spares == [1] and plan.status["spares"]["failures"] == 1


def test_an_ask_is_for_that_pod_not_a_later_spare_under_its_name() -> None:
    reused = spare(0)
    reused["metadata"]["uid"] = "s0-again"  # the name came free and a new spare took it
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1), reused], NODES, NOW,
                  yielding_spares=YIELD)  # fmt: skip
    assert plan.delete_pods == [] and not [e for e in plan.events if e.reason == "SparePreempted"]


def test_a_spare_asked_to_yield_never_takes_a_lost_rank() -> None:
    # The admission pass asked while worker-1 was being lost: the in-place attempt creates a
    # worker for rank 1 instead, and the spare goes.
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), evicted(1), spare(0)], NODES, NOW,
                  yielding_spares=YIELD)  # fmt: skip
    assert plan.status["attempt"] == 1 and plan.relabel_pods == {}
    assert [k["name"] for k in plan.status["inPlace"]["keptPods"]] == ["j-worker-0"]
    assert plan.status["lastRecovery"]["path"] == "InPlace"
    assert "j-spare-0" in plan.delete_pods


def test_an_ask_that_comes_after_a_takeover_deletes_nothing() -> None:
    # The admission pass chose the spare from a view before the takeover gave it rank 1.
    plan = decide(job(took_rank_1(), **SPARES), [resident(0), spare(0)], NODES, NOW, yielding_spares=YIELD)
    assert "j-spare-0" not in plan.delete_pods and plan.relabel_pods == {"j-spare-0": 1}
    assert not [e for e in plan.events if e.reason == "SparePreempted"]


def test_a_spare_on_a_node_being_emptied_takes_no_rank() -> None:
    # The drain that evicted worker-1 evicts the spare beside it next: handing it the rank would
    # lose the rank again before the attempt's first step. Before: the spare on n1 took rank 1.
    nodes = {**NODES, "n1": {"metadata": {"name": "n1"}, "spec": {"unschedulable": True},
                             "status": {"conditions": [{"type": "Ready", "status": "True"}]}}}  # fmt: skip
    lost = resident(1, phase="Failed", exit_code=75, spec={"nodeName": "n1"})
    beside = spare(0)
    beside["spec"] = {"nodeName": "n1"}
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), lost, beside], nodes, NOW)
    assert plan.status["inPlace"]["keptPods"] == [{"name": "j-worker-0", "uid": "p0-0"}]
    assert plan.relabel_pods == {} and "replacing worker-1" in plan.status["message"]
    # A spare on a schedulable node takes the rank as ever.
    elsewhere = spare(1)
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), lost, beside, elsewhere], nodes, NOW)
    assert plan.relabel_pods == {"j-spare-1": 1}


def ready_node(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


# Tainted by the cluster autoscaler for removal: a pod pinned there never binds (rules/stranded.py).
GOING = ready_node("n1", taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}])


def pinned_spare(number: int, node: str) -> dict[str, Any]:
    """Admitted (pinned, gate lifted) onto `node` and not bound yet."""
    from phalanx.builders.pods import admitted_pod

    waiting = spare(number, phase="Pending")
    del waiting["spec"]["nodeName"]
    return admitted_pod(waiting, node)


def test_an_idle_spare_admitted_onto_a_node_that_will_not_take_it_is_deleted_and_replaced() -> None:
    # Admitted (pinned, not bound) onto a node the autoscaler then removes: it would stand there for
    # good, counted alive.
    pinned = pinned_spare(0, "n1")
    nodes = {**NODES, "n1": GOING}
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1), pinned], nodes, NOW)
    assert plan.delete_pods == ["j-spare-0"] and plan.create_spares == [] and plan.create_indices == []
    assert plan.status["phase"] == "Running" and plan.status["attempt"] == 0  # the gang is not touched
    [event] = plan.events
    assert event.reason == "SpareStranded" and "node n1, which is being removed" in event.message
    # Once it is gone, another is made.
    plan = decide(job(dict(plan.status), **SPARES), [resident(0), resident(1)], nodes, NOW + 1)
    assert len(plan.create_spares) == 1
    # On a node that takes pods, it waits for the scheduler.
    healthy = {**NODES, "n1": ready_node("n1")}
    plan = decide(job(dict(RUNNING), **SPARES), [resident(0), resident(1), pinned], healthy, NOW)
    assert plan.delete_pods == []


def test_fewer_spares_asked_for_while_one_is_stranded_keeps_the_one_that_stays() -> None:
    # Two spares for spec.spares 1 (it was lowered) as spare-0 is found stranded: spare-0 goes, spare-1 stays
    # (counting the stranded one as surplus-eligible removed both, leaving none for a pass).
    pods = [
        resident(0),
        resident(1),
        pinned_spare(0, "n1"),
        spare(1, phase="Pending"),
    ]  # spare-1 still starting
    plan = decide(job(dict(RUNNING), **SPARES), pods, {**NODES, "n1": GOING}, NOW)
    assert plan.delete_pods == ["j-spare-0"]
