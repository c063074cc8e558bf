"""The TrainingJob state machine, decision by decision (pure: no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.reconcile.lifecycle import Event, decide, iso, merged_events

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0
NODES = {"n0": {"metadata": {"name": "n0"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}}


def job(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}, **spec},
        "status": status or {},
    }


def pod(
    index: int, attempt: int = 0, phase: str = "Running", exit_code: int | None = None, **extra: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True"}] if phase == "Running" else [],
    }
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": exit_code}}}]
    status.update(extra.pop("status", {}))
    return {
        "metadata": {"name": f"j-worker-{index}", "uid": f"p{index}-{attempt}",
                     "labels": {"phalanx.dev/replica-index": str(index), "phalanx.dev/attempt": str(attempt)},
                     **extra.pop("metadata", {})},
        "spec": {"nodeName": "n0", **extra.pop("spec", {})},
        "status": status,
    }  # fmt: skip


RUNNING = {
    "attempt": 0,
    "createdAttempt": 0,
    "phase": "Running",
    "admittedTime": iso(NOW - 60),
    "startTime": iso(NOW - 60),
}


def test_a_new_job_creates_every_pod() -> None:
    plan = decide(job(), [], NODES, NOW)
    assert plan.create_indices == [0, 1]
    assert plan.status["phase"] == "Pending"


def test_after_a_crash_between_creations_only_missing_pods_are_created() -> None:
    plan = decide(job({"attempt": 0}), [pod(0, phase="Pending")], NODES, NOW)
    assert plan.create_indices == [1]


def test_all_pods_created_marks_the_attempt_created() -> None:
    plan = decide(job({"attempt": 0}), [pod(0, phase="Pending"), pod(1, phase="Pending")], NODES, NOW)
    assert plan.create_indices == [] and plan.status["createdAttempt"] == 0


def test_every_worker_succeeded_makes_the_job_succeed() -> None:
    plan = decide(
        job(dict(RUNNING)),
        [pod(0, phase="Succeeded", exit_code=0), pod(1, phase="Succeeded", exit_code=0)],
        NODES,
        NOW,
    )
    assert plan.status["phase"] == "Succeeded" and plan.status["completionTime"] == iso(NOW)


def test_preemption_restarts_the_gang_without_spending_the_failure_budget() -> None:
    evicted = pod(1, phase="Failed", exit_code=75)
    plan = decide(job(dict(RUNNING)), [pod(0), evicted], NODES, NOW)
    assert plan.status["phase"] == "Restarting"
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}
    assert plan.status["attempt"] == 1
    assert set(plan.delete_pods) == {"j-worker-0", "j-worker-1"}
    assert plan.create_indices == []


def test_a_missing_pod_after_creation_is_a_preemption() -> None:
    plan = decide(job(dict(RUNNING)), [pod(0)], NODES, NOW)
    assert plan.status["restarts"]["preemptions"] == 1


def test_disruption_condition_on_a_running_pod_restarts_nothing() -> None:
    flagged = pod(1, status={"conditions": [{"type": "Ready", "status": "True"},
                                            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]})  # fmt: skip
    plan = decide(job(dict(RUNNING)), [pod(0), flagged], NODES, NOW)
    assert plan.status["phase"] == "Running" and plan.delete_pods == []


def test_retryable_failure_counts_until_the_backoff_limit() -> None:
    crashed = [pod(0), pod(1, phase="Failed", exit_code=137)]
    plan = decide(job(dict(RUNNING), runPolicy={"backoffLimit": 1}), crashed, NODES, NOW)
    assert plan.status["restarts"]["failures"] == 1 and plan.status["phase"] == "Restarting"
    spent = {**RUNNING, "restarts": {"failures": 1, "preemptions": 0}}
    plan = decide(job(spent, runPolicy={"backoffLimit": 1}), crashed, NODES, NOW)
    assert plan.status["phase"] == "Failed"
    assert any(
        c["type"] == "Failed" and c["reason"] == "BackoffLimitExceeded" for c in plan.status["conditions"]
    )


def test_permanent_exit_code_fails_at_once_and_stops_the_rest() -> None:
    plan = decide(job(dict(RUNNING)), [pod(0), pod(1, phase="Failed", exit_code=2)], NODES, NOW)
    assert plan.status["phase"] == "Failed" and plan.delete_pods == ["j-worker-0"]


def test_listed_retryable_exit_code_restarts_instead_of_failing() -> None:
    plan = decide(
        job(dict(RUNNING), runPolicy={"retryableExitCodes": [2]}),
        [pod(0), pod(1, phase="Failed", exit_code=2)],
        NODES,
        NOW,
    )
    assert plan.status["phase"] == "Restarting" and plan.status["restarts"]["failures"] == 1


def test_pods_of_the_previous_attempt_must_be_gone_before_new_ones_are_created() -> None:
    status = {"attempt": 1, "phase": "Restarting", "restarts": {"failures": 0, "preemptions": 1}}
    old = pod(0, attempt=0, metadata={"deletionTimestamp": iso(NOW)})
    plan = decide(job(status), [old], NODES, NOW)
    assert plan.create_indices == [] and plan.status["phase"] == "Restarting"
    plan = decide(job(status), [], NODES, NOW)
    assert plan.create_indices == [0, 1]


def test_gang_timeout_tears_down_and_requeues_with_backoff() -> None:
    admitted = {"attempt": 0, "createdAttempt": 0, "phase": "Admitted", "admittedTime": iso(NOW - 400)}
    plan = decide(job(admitted), [pod(0), pod(1, phase="Pending", spec={"nodeName": ""})], NODES, NOW)
    assert plan.status["gangTimeouts"] == 1 and plan.status["attempt"] == 1
    assert plan.status["requeueAfter"] == iso(NOW + 10)
    assert set(plan.delete_pods) == {"j-worker-0", "j-worker-1"}
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 0}
    plan = decide(job(dict(plan.status)), [], NODES, NOW + 5)
    assert plan.create_indices == [] and plan.status["phase"] == "Pending"


def test_gated_pods_wait_with_the_admission_message() -> None:
    gated = [
        pod(i, phase="Pending", spec={"nodeName": "", "schedulingGates": [{"name": "phalanx.dev/gang"}]})
        for i in (0, 1)
    ]
    status = {"attempt": 0, "createdAttempt": 0, "admissionMessage": "needs 2 pods x 8 nvidia.com/gpu"}
    plan = decide(job(status), gated, NODES, NOW)
    assert plan.status["phase"] == "Pending"
    admitted = next(c for c in plan.status["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "False" and "needs 2 pods" in admitted["message"]


def test_a_gang_with_any_pod_still_gated_waits_even_when_others_are_placed() -> None:
    # An operator stopped half-way through lifting the gates: the gang is not admitted until all are.
    gate = {"nodeName": "", "schedulingGates": [{"name": "phalanx.dev/gang"}]}
    pods = [pod(0), pod(1), pod(2, phase="Pending", spec=gate)]
    status = {"attempt": 0, "createdAttempt": 0, "admissionMessage": "needs 1 pod x 8 nvidia.com/gpu"}
    plan = decide(job(status, replicas=3), pods, NODES, NOW)
    admitted = next(c for c in plan.status["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "False" and plan.status["phase"] == "Pending"
    assert "admittedTime" not in plan.status


def test_deadline_fails_the_job() -> None:
    plan = decide(job(dict(RUNNING), runPolicy={"activeDeadlineSeconds": 30}), [pod(0), pod(1)], NODES, NOW)
    assert plan.status["phase"] == "Failed"
    assert any(c["reason"] == "DeadlineExceeded" for c in plan.status["conditions"])


def test_ttl_deletes_the_finished_job_when_due() -> None:
    done = {"phase": "Succeeded", "attempt": 0, "completionTime": iso(NOW - 10)}
    assert decide(job(done, runPolicy={"ttlSecondsAfterFinished": 5}), [], NODES, NOW).delete_job
    later = decide(job(done, runPolicy={"ttlSecondsAfterFinished": 60}), [], NODES, NOW)
    assert not later.delete_job and later.recheck_after == pytest.approx(50)


def test_phase_change_emits_one_event_and_repeating_emits_none() -> None:
    plan = decide(
        job(dict(RUNNING)),
        [pod(0, phase="Succeeded", exit_code=0), pod(1, phase="Succeeded", exit_code=0)],
        NODES,
        NOW,
    )
    assert [e.reason for e in plan.events] == ["Completed"]
    again = decide(job(dict(plan.status)), [pod(0, phase="Succeeded", exit_code=0)], NODES, NOW)
    assert again.events == []


def test_pods_on_a_deleted_node_are_lost_at_once_and_removed_without_grace() -> None:
    on_gone_node = pod(1, spec={"nodeName": "gone"})
    plan = decide(job(dict(RUNNING)), [pod(0), on_gone_node], NODES, NOW)
    assert plan.status["restarts"]["preemptions"] == 1 and plan.status["phase"] == "Restarting"
    assert plan.force_delete_pods == ["j-worker-1"]


def test_an_empty_node_cache_never_counts_as_node_loss() -> None:
    plan = decide(job(dict(RUNNING)), [pod(0), pod(1, spec={"nodeName": "gone"})], {}, NOW)
    assert plan.status["phase"] == "Running" and plan.force_delete_pods == []


def test_normal_events_of_one_reconcile_become_one_and_warnings_stay_apart() -> None:
    created = Event("Normal", "Created", "created 4 pod(s) for attempt 0")
    admitted = Event("Normal", "GangAdmitted", "0/4 worker(s) running")
    conflict = Event("Warning", "NameConflict", "pod w-1 exists")
    assert merged_events([created]) == [created]
    assert merged_events([created, conflict]) == [created, conflict]
    assert merged_events([created, conflict, admitted]) == [
        Event("Normal", "GangAdmitted", "created 4 pod(s) for attempt 0; 0/4 worker(s) running"),
        conflict,
    ]


def not_ready_node(name: str, since: float, status: str = "Unknown") -> dict[str, Any]:
    ready = {
        "type": "Ready",
        "status": status,
        "reason": "NodeStatusUnknown",
        "lastTransitionTime": iso(since),
    }
    return {"metadata": {"name": name}, "status": {"conditions": [ready]}}


def test_a_running_gang_with_a_pod_on_a_node_not_ready_past_the_bound_restarts_as_a_preemption() -> None:
    """Issue 12 B2: a silent node's pods still say Running; a gang with a rank there is not training."""
    nodes = {**NODES, "silent": not_ready_node("silent", NOW - 25)}
    on_silent = pod(1, spec={"nodeName": "silent"})
    plan = decide(job(dict(RUNNING)), [pod(0), on_silent], nodes, NOW)  # default bound: 20 s
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 1
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}
    assert "silent" in plan.status["message"]
    assert set(plan.delete_pods) == {"j-worker-0", "j-worker-1"} and plan.force_delete_pods == []


def test_within_the_bound_a_not_ready_node_is_waited_for_and_looked_at_again_in_time() -> None:
    nodes = {**NODES, "silent": not_ready_node("silent", NOW - 5, status="False")}
    plan = decide(job(dict(RUNNING)), [pod(0), pod(1, spec={"nodeName": "silent"})], nodes, NOW,
                  node_lost_after=20)  # fmt: skip
    assert plan.status["phase"] == "Running" and plan.delete_pods == []
    assert plan.recheck_after is not None and plan.recheck_after <= 15


def test_a_pod_stuck_terminating_on_a_lost_node_does_not_hold_the_next_attempt_back() -> None:
    """The old attempt's pod on the silent node never goes (nobody confirms its deletion); the pod on a
    healthy node is still waited for (it saves the SIGTERM checkpoint). Once that one is gone, the next
    attempt is created under names of its own, so no two attempts' pods share a name."""
    nodes = {**NODES, "silent": not_ready_node("silent", NOW - 60)}
    deleting = {"deletionTimestamp": iso(NOW + 30)}
    restarting = {
        **RUNNING,
        "attempt": 1,
        "phase": "Restarting",
        "restarts": {"failures": 0, "preemptions": 1},
    }
    restarting.pop("createdAttempt")
    lingering = pod(1, spec={"nodeName": "silent"}, metadata=deleting)
    healthy = pod(0, metadata=deleting)
    waiting = decide(job(dict(restarting)), [healthy, lingering], nodes, NOW)
    assert waiting.create_indices == [] and waiting.status["phase"] == "Restarting"
    assert "waiting for 1 pod(s)" in waiting.status["message"]

    plan = decide(job(dict(restarting)), [lingering], nodes, NOW)
    assert plan.create_indices == [0, 1]
    assert plan.attempt_in_names is True
    assert plan.avoid_nodes == ["silent"]  # and the new attempt stays off the lost node
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}


def test_resume_resets_the_start_time_so_the_deadline_counts_from_the_next_run() -> None:
    # Suspended for an hour with a 60 s deadline: resuming must not fail the job at once (batch/v1 Job).
    suspended = {**RUNNING, "phase": "Suspended", "startTime": iso(NOW - 3600)}
    deadline = {"activeDeadlineSeconds": 60}
    plan = decide(job(suspended, runPolicy=deadline), [], NODES, NOW)
    assert plan.status["phase"] == "Pending" and plan.status["attempt"] == 1
    assert "startTime" not in plan.status
    resumed = {**plan.status, "createdAttempt": 1, "admittedTime": iso(NOW)}
    plan = decide(job(resumed, runPolicy=deadline), [pod(0, attempt=1), pod(1, attempt=1)], NODES, NOW + 5)
    assert plan.status["phase"] == "Running" and plan.status["startTime"] == iso(NOW + 5)
    plan = decide(job(dict(plan.status), runPolicy=deadline), [pod(0, attempt=1), pod(1, attempt=1)],
                  NODES, NOW + 66)  # fmt: skip
    assert plan.status["phase"] == "Failed", "the deadline still counts from the new start"


@pytest.mark.parametrize("provider", ["volcano", "coscheduling", "none"])
def test_gang_timeout_is_left_to_the_external_scheduler(provider: str) -> None:
    # Their queue wait may be longer than the gang timeout; Phalanx did not admit these pods.
    admitted = {"attempt": 0, "createdAttempt": 0, "phase": "Admitted", "admittedTime": iso(NOW - 400)}
    pending = [pod(i, phase="Pending", spec={"nodeName": ""}) for i in (0, 1)]
    plan = decide(job(admitted, scheduling={"provider": provider}), pending, NODES, NOW)
    assert plan.delete_pods == [] and plan.status["attempt"] == 0 and "gangTimeouts" not in plan.status
    assert plan.status["phase"] == "Admitted"


def test_gang_timeout_zero_turns_the_teardown_off() -> None:
    admitted = {"attempt": 0, "createdAttempt": 0, "phase": "Admitted", "admittedTime": iso(NOW - 86400)}
    pending = [pod(0), pod(1, phase="Pending", spec={"nodeName": ""})]
    plan = decide(job(admitted, scheduling={"gang": {"timeoutSeconds": 0}}), pending, NODES, NOW)
    assert plan.delete_pods == [] and plan.status["attempt"] == 0 and plan.status["phase"] == "Admitted"


def refused_at(ts: float) -> dict[str, Any]:
    return {"type": "PodsCreated", "status": "False", "reason": "CreateRefused",
            "message": 'pods "j-worker-1" is forbidden: exceeded quota', "lastTransitionTime": iso(ts)}  # fmt: skip


def test_a_gang_created_only_in_part_keeps_trying_until_the_gang_timeout() -> None:
    status = {"attempt": 0, "phase": "Pending", "conditions": [refused_at(NOW - 4)]}
    plan = decide(job(status, scheduling={"gang": {"timeoutSeconds": 10}}), [pod(0)], NODES, NOW)
    assert plan.create_indices == [1] and plan.delete_pods == []
    assert plan.recheck_after is not None and plan.recheck_after <= 6


def test_a_gang_created_only_in_part_is_torn_down_after_the_gang_timeout() -> None:
    # The pod that was created holds its node's GPUs for nothing while its peer is refused.
    status = {"attempt": 0, "phase": "Pending", "conditions": [refused_at(NOW - 11)]}
    plan = decide(job(status, scheduling={"gang": {"timeoutSeconds": 10}}), [pod(0)], NODES, NOW)
    assert plan.create_indices == [] and plan.delete_pods == ["j-worker-0"]
    assert plan.status["attempt"] == 1 and plan.status["gangTimeouts"] == 1
    assert plan.status["requeueAfter"] == iso(NOW + 10)
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 0}
    assert "exceeded quota" in plan.status["message"]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "GangTimeout")]
    # The next attempt's refusal starts its own clock.
    assert not any(c["type"] == "PodsCreated" for c in plan.status["conditions"])


def test_a_refused_creation_with_nothing_created_holds_nothing_and_keeps_trying() -> None:
    status = {"attempt": 0, "phase": "Pending", "conditions": [refused_at(NOW - 3600)]}
    plan = decide(job(status, scheduling={"gang": {"timeoutSeconds": 10}}), [], NODES, NOW)
    assert plan.create_indices == [0, 1] and plan.status["attempt"] == 0


def test_a_preempted_job_running_again_is_no_longer_marked_preempted() -> None:
    preempted = {"type": "Preempted", "status": "True", "reason": "PreemptedByPriority",
                 "message": "preempted by ns/high, priority 1000", "lastTransitionTime": iso(NOW - 30)}  # fmt: skip
    status = {**RUNNING, "phase": "Admitted", "attempt": 1, "createdAttempt": 1, "conditions": [preempted]}
    plan = decide(job(status), [pod(0, attempt=1), pod(1, attempt=1)], NODES, NOW)
    assert plan.status["phase"] == "Running"
    cleared = next(c for c in plan.status["conditions"] if c["type"] == "Preempted")
    assert cleared["status"] == "False" and cleared["reason"] == "Running"
    # Between the condition and the eviction the victim still runs: the condition stays.
    plan = decide(job({**status, "phase": "Running"}), [pod(0, attempt=1), pod(1, attempt=1)], NODES, NOW)
    assert next(c for c in plan.status["conditions"] if c["type"] == "Preempted")["status"] == "True"
    # While it waits, the condition still says who preempted it.
    plan = decide(job(status), [pod(0, attempt=1, phase="Pending"), pod(1, attempt=1)], NODES, NOW)
    kept = next(c for c in plan.status["conditions"] if c["type"] == "Preempted")
    assert kept["status"] == "True" and "ns/high" in kept["message"]
