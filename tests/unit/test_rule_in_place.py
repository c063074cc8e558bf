"""Restart in place through decide() (reconcile/rules/in_place.py): the transition that keeps the
running pods, what the next passes do with them, and every fallback to a full restart with its
InPlaceFallback event."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.pods import JobRef, build_worker_pod
from phalanx.cache import slim_pod
from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import Event, iso
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, not_ready_node, pod

pytestmark = pytest.mark.unit

IN_PLACE = {"runPolicy": {"restartStrategy": "InPlace", "backoffLimit": 2}}
LAUNCHER = {"phalanx.dev/resident-launcher": "true"}


def resident(index: int, attempt: int = 0, **extra: Any) -> dict[str, Any]:
    """A pod whose trainer container is a resident launcher (builders/pods.py, restartStrategy InPlace)."""
    status = {"podIP": f"10.0.0.{index + 1}", **extra.pop("status", {})}
    metadata = {"annotations": LAUNCHER, **extra.pop("metadata", {})}
    return pod(index, attempt, status=status, metadata=metadata, **extra)


def evicted(index: int, attempt: int = 0) -> dict[str, Any]:
    return resident(index, attempt, phase="Failed", exit_code=75)


def fallbacks(events: list[Event]) -> list[str]:
    return [e.message for e in events if e.reason == "InPlaceFallback"]


def in_place_status(attempt: int = 1, kept: tuple[str, ...] = ("j-worker-0",)) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "phase": "Restarting",
        "restarts": {"failures": 0, "preemptions": 1},
        "inPlace": {"attempt": attempt, "keptPods": [{"name": n, "uid": f"p{n[-1]}-0"} for n in kept],
                    "time": iso(NOW - 5)},
        "lastRecovery": {"attempt": attempt, "path": "InPlace", "disruptedTime": "2027-01-15T08:00:00.000Z",
                         "phasesMilliseconds": {}},
    }  # fmt: skip


def test_an_evicted_worker_is_replaced_alone_and_the_running_one_is_kept() -> None:
    plan = decide(job(dict(RUNNING), **IN_PLACE), [resident(0), evicted(1)], NODES, NOW)
    assert plan.status["attempt"] == 1
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}
    assert plan.status["inPlace"] == {"attempt": 1, "keptPods": [{"name": "j-worker-0", "uid": "p0-0"}],
                                      "time": iso(NOW), "stop": "checkpoint"}  # fmt: skip
    assert plan.delete_pods == ["j-worker-1"]  # worker-0 stays
    assert plan.status["phase"] == "Restarting"
    assert (
        "restarting in place as attempt 1: keeping j-worker-0, replacing worker-1" in plan.status["message"]
    )
    assert plan.status["lastRecovery"]["path"] == "InPlace"
    assert fallbacks(plan.events) == []


def test_a_retryable_failure_spends_the_failure_budget_as_a_full_restart_would() -> None:
    plan = decide(job(dict(RUNNING), **IN_PLACE), [resident(0), resident(1, phase="Failed", exit_code=137)],
                  NODES, NOW)  # fmt: skip
    assert plan.status["restarts"] == {"failures": 1, "preemptions": 0}
    assert plan.status["inPlace"]["attempt"] == 1 and plan.delete_pods == ["j-worker-1"]
    assert plan.status["lastRecovery"]["reason"] == "FailureRestart"
    # The lost rank can agree on no checkpoint: the kept ones stop at once (review M6); a
    # preempted rank checkpoints with its peers on SIGTERM, so there they stop at the checkpoint.
    assert plan.status["inPlace"]["stop"] == "now"


def test_a_spent_failure_budget_fails_the_job_rather_than_restarting_in_place() -> None:
    status = {**RUNNING, "restarts": {"failures": 2, "preemptions": 0}}
    plan = decide(
        job(status, **IN_PLACE), [resident(0), resident(1, phase="Failed", exit_code=137)], NODES, NOW
    )
    assert plan.status["phase"] == "Failed" and "inPlace" not in plan.status


def test_hangs_spend_the_same_failure_budget() -> None:
    status = {**RUNNING, "restarts": {"failures": 1, "preemptions": 0, "hangs": 1}}
    plan = decide(
        job(status, **IN_PLACE), [resident(0), resident(1, phase="Failed", exit_code=137)], NODES, NOW
    )
    assert plan.status["phase"] == "Failed" and "inPlace" not in plan.status


def test_full_restart_is_the_default() -> None:
    plan = decide(job(dict(RUNNING)), [resident(0), evicted(1)], NODES, NOW)
    assert set(plan.delete_pods) == {"j-worker-0", "j-worker-1"} and "inPlace" not in plan.status
    assert fallbacks(plan.events) == []


def test_the_kept_pod_counts_as_the_new_attempt_and_only_the_lost_index_is_created() -> None:
    # Next pass: the evicted pod is gone; worker-0 (attempt label 0) belongs to attempt 1.
    status = in_place_status()
    plan = decide(job(status, **IN_PLACE), [resident(0)], NODES, NOW)
    assert plan.create_indices == [1] and not plan.attempt_in_names
    assert plan.delete_pods == []  # housekeeping does not take the kept pod for an older attempt's
    assert plan.status["replicas"]["active"] == 1


def test_a_pod_under_a_kept_name_with_another_uid_is_not_kept() -> None:
    stranger = resident(0, metadata={"uid": "someone-else"})
    plan = decide(job(in_place_status(), **IN_PLACE), [stranger], NODES, NOW)
    assert plan.delete_pods == ["j-worker-0"] and plan.status["phase"] == "Restarting"


def test_the_replacement_waits_for_the_lost_pod_to_go() -> None:
    going = evicted(1)
    going["metadata"]["deletionTimestamp"] = iso(NOW - 1)
    plan = decide(job(in_place_status(), **IN_PLACE), [resident(0), going], NODES, NOW)
    assert plan.create_indices == [] and plan.delete_pods == []
    assert plan.status["message"] == "waiting for 1 pod(s) of the previous attempt to stop"


def test_kept_and_replacement_running_is_running_again() -> None:
    status = {**in_place_status(), "createdAttempt": 1, "admittedTime": iso(NOW - 2)}
    plan = decide(job(status, **IN_PLACE), [resident(0), resident(1, attempt=1)], NODES, NOW)
    assert plan.status["phase"] == "Running"
    assert plan.status["lastRecovery"]["phasesMilliseconds"].keys() >= {"podsStopped", "podsRunning"}


def test_a_second_disruption_before_the_first_step_falls_back_to_a_full_restart() -> None:
    status = {**in_place_status(), "createdAttempt": 1, "phase": "Running"}
    plan = decide(job(status, **IN_PLACE), [resident(0), evicted(1, attempt=1)], NODES, NOW)
    assert set(plan.delete_pods) == {"j-worker-0", "j-worker-1"}
    assert plan.status["attempt"] == 2 and "inPlace" not in plan.status
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 2}  # counted as ever
    assert plan.status["lastRecovery"]["path"] == "FullRestart"
    [why] = fallbacks(plan.events)
    assert "two failures in one generation" in why and why.endswith("restarting the whole gang instead")


def test_after_its_first_step_an_in_place_attempt_may_restart_in_place_again() -> None:
    status = {**in_place_status(), "createdAttempt": 1, "phase": "Running"}
    status["lastRecovery"] = {**status["lastRecovery"], "phasesMilliseconds": {"firstStep": 4000}}
    kept, lost = resident(0), evicted(1, attempt=1)
    plan = decide(job(status, **IN_PLACE), [kept, lost], NODES, NOW)
    assert plan.status["inPlace"]["attempt"] == 2 and plan.delete_pods == ["j-worker-1"]
    assert plan.status["inPlace"]["keptPods"] == [{"name": "j-worker-0", "uid": "p0-0"}]


@pytest.mark.parametrize(
    ("pods", "why"),
    [
        ([evicted(0), resident(1)], "rank 0, the host of the generation's rendezvous store"),
        ([evicted(0), evicted(1)], "no pod of the gang is left running"),
        ([pod(0, status={"podIP": "10.0.0.1"}), evicted(1)], "runs no resident launcher"),
        ([resident(0), resident(1, phase="Succeeded", exit_code=0), evicted(2)], "j-worker-1 is Succeeded"),
    ],
)
def test_what_in_place_cannot_recover_restarts_the_whole_gang_and_says_why(
    pods: list[dict[str, Any]], why: str
) -> None:
    spec = {**IN_PLACE, "replicas": len(pods)}
    plan = decide(job(dict(RUNNING), **spec), pods, NODES, NOW)
    assert plan.status["phase"] == "Restarting" and "inPlace" not in plan.status
    assert {p["metadata"]["name"] for p in pods if p["status"]["phase"] != "Succeeded"} <= set(
        plan.delete_pods
    )
    [message] = fallbacks(plan.events)
    assert why in message, message
    assert any(e.type == "Warning" and e.reason == "InPlaceFallback" for e in plan.events)


def test_a_pod_on_a_lost_node_falls_back_it_holds_its_name() -> None:
    nodes = {**NODES, "n1": not_ready_node("n1", NOW - 600)}
    lost = resident(1, spec={"nodeName": "n1"})
    plan = decide(job(dict(RUNNING), **IN_PLACE), [resident(0), lost], nodes, NOW, node_lost_after=60)
    assert "inPlace" not in plan.status and "j-worker-0" in plan.delete_pods
    [message] = fallbacks(plan.events)
    assert "on a lost node" in message


def test_a_gang_not_yet_running_whole_falls_back() -> None:
    status = {**RUNNING, "phase": "Admitted"}
    plan = decide(job(status, **IN_PLACE), [resident(0), evicted(1)], NODES, NOW)
    assert "inPlace" not in plan.status
    [message] = fallbacks(plan.events)
    assert "not running whole (phase Admitted)" in message


def test_a_launcher_that_refused_its_generation_falls_back_without_counting_again() -> None:
    status = in_place_status()
    refusals = {"j-worker-0": "HTTP 409: the launcher is exiting"}
    plan = decide(job(status, **IN_PLACE), [resident(0)], NODES, NOW, launcher_refusals=refusals)
    assert plan.status["attempt"] == 2 and "inPlace" not in plan.status
    assert plan.delete_pods == ["j-worker-0"]  # the kept pod goes too: every pod is replaced
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}  # the disruption counted once
    assert (
        plan.status["lastRecovery"]["path"] == "FullRestart" and plan.status["lastRecovery"]["attempt"] == 2
    )
    [message] = fallbacks(plan.events)
    assert (
        "the launcher of j-worker-0 did not take the generation: HTTP 409: the launcher is exiting" in message
    )


def test_a_refusal_of_another_pod_or_attempt_changes_nothing() -> None:
    plan = decide(job(in_place_status(), **IN_PLACE), [resident(0)], NODES, NOW,
                  launcher_refusals={"j-worker-1": "unreachable"})  # fmt: skip
    assert plan.status["attempt"] == 1 and plan.create_indices == [1]


def test_a_replacement_not_running_within_the_gang_timeout_falls_back() -> None:
    # The lost pod's grace period (60 s by default) first, then the gang timeout (300 s).
    status = {**in_place_status(), "inPlace": {**in_place_status()["inPlace"], "time": iso(NOW - 361)}}
    gated = resident(1, attempt=1, phase="Pending", spec={"schedulingGates": [{"name": "phalanx.dev/gang"}]})
    plan = decide(job({**status, "createdAttempt": 1}, **IN_PLACE), [resident(0), gated], NODES, NOW)
    assert plan.status["attempt"] == 2 and set(plan.delete_pods) == {"j-worker-0", "j-worker-1"}
    [message] = fallbacks(plan.events)
    assert (
        "did not run within spec.runPolicy.terminationGracePeriodSeconds=60 + spec.scheduling.gang.timeoutSeconds=300"
        in message
    )


def test_before_the_gang_timeout_the_replacement_is_waited_for_and_looked_at_again_in_time() -> None:
    gated = resident(1, attempt=1, phase="Pending", spec={"schedulingGates": [{"name": "phalanx.dev/gang"}]})
    plan = decide(
        job({**in_place_status(), "createdAttempt": 1}, **IN_PLACE), [resident(0), gated], NODES, NOW
    )
    assert plan.status["attempt"] == 1 and plan.delete_pods == [] and fallbacks(plan.events) == []
    assert plan.recheck_after is not None and plan.recheck_after <= 355  # inPlace.time was 5 s ago


# -- where the in-place rules stand in reconcile/lifecycle.py's order ---------------------------


def test_a_permanent_failure_fails_the_job_rather_than_restarting_in_place() -> None:
    plan = decide(job(dict(RUNNING), **IN_PLACE), [resident(0), resident(1, phase="Failed", exit_code=1)],
                  NODES, NOW)  # fmt: skip
    assert plan.status["phase"] == "Failed" and "inPlace" not in plan.status and fallbacks(plan.events) == []


def test_a_passed_deadline_beats_an_in_place_restart() -> None:
    spec = {"runPolicy": {**IN_PLACE["runPolicy"], "activeDeadlineSeconds": 30}}
    plan = decide(job(dict(RUNNING), **spec), [resident(0), evicted(1)], NODES, NOW)
    assert plan.status["phase"] == "Failed" and "inPlace" not in plan.status


def test_suspension_of_an_in_place_attempt_deletes_the_kept_pods_too() -> None:
    spec = {"runPolicy": {**IN_PLACE["runPolicy"], "suspend": True}}
    plan = decide(job(in_place_status(), **spec), [resident(0)], NODES, NOW)
    assert plan.status["phase"] == "Suspended" and plan.delete_pods == ["j-worker-0"]


def test_a_launcher_refusal_is_acted_on_before_waiting_for_the_lost_pod() -> None:
    going = evicted(1)
    going["metadata"]["deletionTimestamp"] = iso(NOW - 1)
    plan = decide(job(in_place_status(), **IN_PLACE), [resident(0), going], NODES, NOW,
                  launcher_refusals={"j-worker-0": "unreachable"})  # fmt: skip
    assert plan.status["attempt"] == 2 and plan.delete_pods == ["j-worker-0"]


def test_the_transition_is_decided_on_the_pod_stores_slim_copies_of_built_pods() -> None:
    # The reconcile reads pods from the watch-fed store (cache.slim_pod), which drops the env: what
    # marks a resident launcher must survive that (it failed so in the e2e test before the annotation).
    raw = job(dict(RUNNING), **IN_PLACE)
    spec = parse(TrainingJobSpec, raw["spec"])
    ref = JobRef("j", "ns", "u")
    built = [build_worker_pod(ref, spec, i, 0, raw["spec"]["template"]) for i in range(2)]
    for i, p in enumerate(built):
        p["metadata"]["uid"] = f"p{i}-0"
        p["spec"]["nodeName"] = "n0"
        p["status"] = {"phase": "Running", "podIP": f"10.0.0.{i + 1}"}
    built[1]["metadata"]["deletionTimestamp"] = iso(NOW - 1)  # evicted: terminating
    plan = decide(raw, [slim_pod(p) for p in built], NODES, NOW)
    assert plan.status["inPlace"]["keptPods"] == [{"name": "j-worker-0", "uid": "p0-0"}], plan.events


def test_a_kept_pod_that_fails_before_the_first_step_is_a_consequence_of_the_disruption() -> None:
    # From the in-place review (C2): a kept rank that crashes with an ordinary exit code while its
    # peer is being replaced (a torchrun agent giving up on the rendezvous, a worker the launcher
    # could not stop cleanly) crashed because of the disruption. As in a full restart's cascade
    # (policy/pod_outcome.py), that must not fail the job: the whole gang restarts from the newest
    # checkpoint, uncounted (the disruption was counted once). A genuine bug recurs in that attempt,
    # with no disruption before it, and fails the job then.
    status = {**in_place_status(), "inPlace": {**in_place_status()["inPlace"], "time": iso(NOW - 400)}}
    crashed = resident(0, phase="Failed", exit_code=1)
    plan = decide(job({**status, "createdAttempt": 1}, **IN_PLACE), [crashed, resident(1, attempt=1)], NODES, NOW,
                  launcher_refusals={"j-worker-0": "unreachable"})  # fmt: skip
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 2
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 1}
    [message] = fallbacks(plan.events)
    assert "j-worker-0 failed" in message and "before attempt 1 trained its first step" in message
    assert "did not take the generation" not in message  # the crash is what happened, not a refusal


def test_a_kept_pod_that_fails_after_the_first_step_is_judged_and_counted_on_its_own() -> None:
    status = {**in_place_status(), "createdAttempt": 1, "phase": "Running"}
    status["lastRecovery"] = {**status["lastRecovery"], "phasesMilliseconds": {"firstStep": 4000}}
    crashed = resident(0, phase="Failed", exit_code=1)
    plan = decide(job(status, **IN_PLACE), [crashed, resident(1, attempt=1)], NODES, NOW)
    assert plan.status["phase"] == "Failed" and not fallbacks(plan.events)


def test_a_kept_pod_preempted_before_the_first_step_is_a_second_disruption_counted() -> None:
    status = {**in_place_status(), "createdAttempt": 1}
    plan = decide(job(status, **IN_PLACE), [evicted(0), resident(1, attempt=1)], NODES, NOW)
    assert plan.status["attempt"] == 2 and plan.status["restarts"]["preemptions"] == 2


def test_a_kept_pod_gone_before_the_replacement_runs_is_a_second_disruption_not_recreated_quietly() -> None:
    # From the review: worker-1 evicted, worker-0 and worker-2 kept; worker-2's node is deleted.
    status = in_place_status(kept=("j-worker-0", "j-worker-2"))
    plan = decide(job(status, replicas=3, **IN_PLACE), [resident(0)], NODES, NOW)
    assert plan.status["attempt"] == 2 and "inPlace" not in plan.status
    assert plan.status["restarts"]["preemptions"] == 2  # counted: a disruption of its own
    [message] = fallbacks(plan.events)
    assert "j-worker-2 gone" in message


# -- from the second review of the fixes ------------------------------------------------------------


def device_error(index: int, attempt: int = 0) -> dict[str, Any]:
    crashed = resident(index, attempt, phase="Failed", exit_code=1)
    terminated = crashed["status"]["containerStatuses"][0]["state"]["terminated"]
    terminated["message"] = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python"
    return crashed


def test_a_kept_pod_with_a_device_error_before_the_first_step_is_counted_not_taken_for_the_cascade() -> None:
    # A GPU that fell off the bus has a cause of its own: the failure rule counts it (and
    # rules/bad_nodes.py books its node), as it would at any other time.
    status = {**in_place_status(), "createdAttempt": 1}
    plan = decide(job(status, **IN_PLACE), [device_error(0), resident(1, attempt=1)], NODES, NOW)
    assert plan.status["restarts"]["failures"] == 1, plan.status["restarts"]
    assert not any("a consequence of the disruption" in m for m in fallbacks(plan.events))


def test_a_kept_trainer_that_exits_beside_a_running_sidecar_is_the_cascade_too() -> None:
    status = {**in_place_status(), "createdAttempt": 1}
    sidecar_pod = resident(0, status={"containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": 1}}},
        {"name": "sidecar", "state": {"running": {}}},
    ]})  # fmt: skip
    plan = decide(job(status, **IN_PLACE), [sidecar_pod, resident(1, attempt=1)], NODES, NOW)
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 2
    [message] = fallbacks(plan.events)
    assert "kept pod j-worker-0 failed" in message


def test_a_kept_crash_beside_a_kept_preemption_still_counts_the_preemption() -> None:
    status = {**in_place_status(kept=("j-worker-0", "j-worker-2")), "createdAttempt": 1}
    crashed = resident(0, phase="Failed", exit_code=1)
    plan = decide(
        job(status, replicas=3, **IN_PLACE), [crashed, resident(1, attempt=1), evicted(2)], NODES, NOW
    )
    assert plan.status["attempt"] == 2 and plan.status["restarts"]["preemptions"] == 2


def test_the_replacement_timeout_counts_the_lost_pods_grace_period_first() -> None:
    # The replacement cannot be created before the lost pod has gone, which may take its grace
    # period: a long SIGTERM checkpoint must not make every in-place restart fall back.
    spec = {"runPolicy": {**IN_PLACE["runPolicy"], "terminationGracePeriodSeconds": 600}}
    gated = resident(1, attempt=1, phase="Pending", spec={"schedulingGates": [{"name": "phalanx.dev/gang"}]})
    for waited, falls_back in ((400, False), (901, True)):
        status = {**in_place_status(), "createdAttempt": 1,
                  "inPlace": {**in_place_status()["inPlace"], "time": iso(NOW - waited)}}  # fmt: skip
        plan = decide(job(status, **spec), [resident(0), gated], NODES, NOW)
        assert (plan.status["attempt"] == 2) is falls_back, waited
        if falls_back:
            [message] = fallbacks(plan.events)
            assert "terminationGracePeriodSeconds=600 + spec.scheduling.gang.timeoutSeconds=300" in message


def test_the_kept_ranks_stop_at_a_checkpoint_only_when_the_lost_rank_can_still_take_part() -> None:
    terminating = resident(1)
    terminating["metadata"].update(deletionTimestamp=iso(NOW - 1), deletionGracePeriodSeconds=30)
    forced = resident(1)
    forced["metadata"].update(deletionTimestamp=iso(NOW - 1), deletionGracePeriodSeconds=0)
    checkpointed = evicted(1)  # exited 75: it saved with its peers
    killed = resident(1, phase="Failed", status={"conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}, exit_code=137)  # fmt: skip
    for lost, stop in (
        (terminating, "checkpoint"),
        (checkpointed, "checkpoint"),
        (forced, "now"),
        (killed, "now"),
    ):
        plan = decide(job(dict(RUNNING), **IN_PLACE), [resident(0), lost], NODES, NOW)
        assert plan.status["inPlace"]["stop"] == stop, (lost["metadata"], lost["status"])


def test_a_drain_replaces_every_rank_on_the_node_in_one_recovery_at_the_agreed_checkpoint() -> None:
    # kubectl drain cordons n1 and evicts worker-1, then worker-2 there. Both go in this recovery;
    # worker-2 is still running, so it saves at the agreed stop like a kept rank (stop "checkpoint").
    # Before: worker-2 was kept, and its eviction turned the in-place attempt into a full restart.
    nodes = {**NODES, "n1": {"metadata": {"name": "n1"}, "spec": {"unschedulable": True},
                             "status": {"conditions": [{"type": "Ready", "status": "True"}]}}}  # fmt: skip
    going = resident(1, phase="Failed", exit_code=75, spec={"nodeName": "n1"})  # saved at SIGTERM
    pods = [resident(0), going, resident(2, spec={"nodeName": "n1"})]
    plan = decide(job(dict(RUNNING), replicas=3, **IN_PLACE), pods, nodes, NOW)
    assert plan.status["inPlace"]["keptPods"] == [{"name": "j-worker-0", "uid": "p0-0"}]
    assert plan.status["inPlace"]["stop"] == "checkpoint"
    assert plan.delete_pods == ["j-worker-1", "j-worker-2"]
    assert (
        "replacing worker-1, worker-2 (node n1 is being emptied: it is cordoned, and j-worker-1 was preempted "
        "from it)" in plan.status["message"]
    )
    assert fallbacks(plan.events) == []


def test_rank_0_on_the_emptied_node_falls_back_and_says_why() -> None:
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    nodes = {"n0": {"metadata": {"name": "n0"}, "spec": {"unschedulable": True}, "status": ready},
             "n2": {"metadata": {"name": "n2"}, "status": ready}}  # fmt: skip
    pods = [resident(0), evicted(1), resident(2, spec={"nodeName": "n2"})]
    plan = decide(job(dict(RUNNING), replicas=3, **IN_PLACE), pods, nodes, NOW)
    assert "inPlace" not in plan.status
    [message] = fallbacks(plan.events)
    assert "rank 0" in message and "node n0 is being emptied: it is cordoned" in message
