"""rules/elastic.py and the sizing in rules/creation.py: an elastic gang starts at the size that
fits, grows at a checkpoint with reason Resize, and a new attempt after a loss shrinks to the room."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.policy.elastic import Room
from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit

ELASTIC = {"elastic": {"minReplicas": 1, "maxReplicas": 2}}


def elastic_job(status: dict[str, Any] | None = None) -> dict[str, Any]:
    j = job(status, **ELASTIC)
    del j["spec"]["replicas"]  # derived: maxReplicas
    return j


def checkpointed(status: dict[str, Any], seconds_after_admission: float = 30) -> dict[str, Any]:
    from phalanx.reconcile.plan import iso

    seen = iso(NOW - 60 + seconds_after_admission)  # when the operator saw it (admitted at NOW - 60)
    return {**status, "lastCheckpoint": {"step": 40, "time": seen, "observedTime": seen}}


def test_the_first_attempt_is_created_at_the_size_that_fits() -> None:
    plan = decide(elastic_job(), [], NODES, NOW, room=Room(pods=1))
    assert plan.create_indices == [0]
    assert plan.status["currentReplicas"] == 1


def test_with_room_for_all_the_first_attempt_is_created_whole() -> None:
    plan = decide(elastic_job(), [], NODES, NOW, room=Room(pods=5))
    assert plan.create_indices == [0, 1] and plan.status["currentReplicas"] == 2


def test_a_fixed_size_job_records_its_size_too() -> None:
    plan = decide(job(), [], NODES, NOW)
    assert plan.create_indices == [0, 1] and plan.status["currentReplicas"] == 2


def test_a_gang_of_one_running_whole_is_running() -> None:
    status = {**RUNNING, "currentReplicas": 1}
    plan = decide(elastic_job(status), [pod(0)], NODES, NOW, room=Room(pods=0))
    assert plan.status["phase"] == "Running" and not plan.delete_pods
    assert plan.recheck_after is not None  # it looks for room again


def test_room_and_a_checkpoint_since_admission_restart_the_gang_with_reason_resize() -> None:
    status = checkpointed({**RUNNING, "currentReplicas": 1})
    plan = decide(elastic_job(status), [pod(0)], NODES, NOW, room=Room(pods=1))
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 1
    assert plan.status["restarts"]["resizes"] == 1
    assert plan.status["restarts"]["failures"] == 0 and plan.status["restarts"]["preemptions"] == 0
    restarting = next(c for c in plan.status["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "Resize" and "growing from 1 towards 2" in restarting["message"]
    assert plan.delete_pods == ["j-worker-0"]


def test_room_without_a_checkpoint_since_admission_waits_for_one() -> None:
    status = checkpointed({**RUNNING, "currentReplicas": 1}, seconds_after_admission=-10)
    plan = decide(elastic_job(status), [pod(0)], NODES, NOW, room=Room(pods=1))
    assert plan.status["phase"] == "Running" and not plan.delete_pods


def test_the_attempt_after_a_resize_restart_is_created_at_the_new_size_with_an_event() -> None:
    status = {"attempt": 1, "phase": "Restarting", "currentReplicas": 1, "restarts": {"resizes": 1},
              "conditions": [{"type": "Restarting", "status": "True", "reason": "Resize", "message": ""}]}  # fmt: skip
    plan = decide(elastic_job(status), [], NODES, NOW, room=Room(pods=2))
    assert plan.create_indices == [0, 1] and plan.status["currentReplicas"] == 2
    resized = [e for e in plan.events if e.reason == "Resized"]
    assert resized and "from 1 to 2" in resized[0].message and "Resize" in resized[0].message


def test_after_a_loss_with_room_for_one_the_next_attempt_shrinks_instead_of_waiting() -> None:
    status = {"attempt": 1, "phase": "Restarting", "currentReplicas": 2,
              "conditions": [{"type": "Restarting", "status": "True", "reason": "NodeLost", "message": ""}]}  # fmt: skip
    plan = decide(elastic_job(status), [], NODES, NOW, room=Room(pods=1))
    assert plan.create_indices == [0] and plan.status["currentReplicas"] == 1
    resized = [e for e in plan.events if e.reason == "Resized"]
    assert resized and "shrinks from 2 to 1" in resized[0].message and "NodeLost" in resized[0].message


def test_the_size_is_kept_while_the_attempt_has_pods() -> None:
    # Half created (index 0 exists) at size 2: the missing pod is created, the size is not re-chosen.
    status = {"attempt": 0, "currentReplicas": 2}
    plan = decide(elastic_job(status), [pod(0, phase="Pending")], NODES, NOW, room=Room(pods=0))
    assert plan.create_indices == [1] and plan.status["currentReplicas"] == 2


def test_a_gang_whose_ranks_are_finishing_does_not_grow() -> None:
    # From the review: rank 1 exited 0 while rank 0 is in its final save; a grow would kill the save
    # and rerun the end of the job from the checkpoint.
    j = job(checkpointed({**RUNNING, "currentReplicas": 2}), elastic={"minReplicas": 1, "maxReplicas": 3})
    del j["spec"]["replicas"]
    plan = decide(j, [pod(0), pod(1, phase="Succeeded", exit_code=0)], NODES, NOW, room=Room(pods=1))
    assert plan.status["attempt"] == 0 and not plan.delete_pods, plan.status.get("message")


GANG_SIZE = "phalanx.dev/gang-size"  # the label every pod carries: its attempt's size


def elastic_job_of(max_replicas: int, status: dict[str, Any] | None = None) -> dict[str, Any]:
    j = job(status, elastic={"minReplicas": 1, "maxReplicas": max_replicas})
    del j["spec"]["replicas"]
    return j


def sized(index: int, size: int, phase: str = "Pending", attempt: int = 0) -> dict[str, Any]:
    p = pod(index, attempt=attempt, phase=phase)
    p["metadata"]["labels"][GANG_SIZE] = str(size)
    return p


@pytest.mark.parametrize("recorded", [{}, {"currentReplicas": 4}])
def test_the_attempt_size_comes_from_its_pods_label_not_a_lost_or_stale_status(
    recorded: dict[str, Any],
) -> None:
    # Pod 0 was created at size 2, then the status write that said so was lost (or is older).
    plan = decide(elastic_job_of(4, {"attempt": 0, **recorded}), [sized(0, 2)], NODES, NOW, room=Room(pods=0))
    assert plan.create_indices == [1]
    assert plan.status["currentReplicas"] == 2


def test_pods_of_one_attempt_that_disagree_on_the_size_restart_it_without_counting() -> None:
    status = {"attempt": 0, "phase": "Pending", "currentReplicas": 4}
    pods = [sized(0, 2), sized(1, 4), sized(2, 4), sized(3, 4)]
    plan = decide(elastic_job_of(4, status), pods, NODES, NOW, room=Room(pods=0))
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 1
    restarts = plan.status["restarts"]
    assert (restarts.get("failures", 0), restarts.get("preemptions", 0), restarts.get("resizes", 0)) == (
        0,
        0,
        0,
    )
    assert sorted(plan.delete_pods) == [f"j-worker-{i}" for i in range(4)] and not plan.create_indices


def test_the_size_chosen_for_an_attempt_holds_while_its_pods_are_not_seen_yet() -> None:
    # The size was recorded before the first create; the pod store lags behind the creates.
    first = decide(elastic_job_of(4), [], NODES, NOW, room=Room(pods=1))
    assert first.create_indices == [0]
    again = decide(elastic_job_of(4, first.status), [], NODES, NOW, room=Room(pods=4))
    assert again.create_indices == [0] and again.status["currentReplicas"] == 1


def timed_out_at_four() -> tuple[dict[str, Any], float]:
    """An elastic attempt sized 4 from the room, admitted 400 s ago (gang timeout 300 s), 2 running."""
    from phalanx.reconcile.plan import iso, parse_iso

    status = {"attempt": 0, "createdAttempt": 0, "sizedAttempt": 0, "phase": "Admitted",
              "currentReplicas": 4, "admittedTime": iso(NOW - 400)}  # fmt: skip
    pods = [sized(i, 4, phase="Running" if i < 2 else "Pending") for i in range(4)]
    plan = decide(elastic_job_of(4, status), pods, NODES, NOW, room=Room(pods=0))
    assert plan.status["phase"] == "Pending" and plan.status["attempt"] == 1
    requeue = parse_iso(plan.status["requeueAfter"])
    assert requeue is not None
    return plan.status, requeue + 1


def test_after_a_gang_timeout_the_next_attempt_is_smaller_though_the_room_looks_the_same() -> None:
    status, later = timed_out_at_four()
    plan = decide(elastic_job_of(4, status), [], NODES, later, room=Room(pods=4))
    assert plan.create_indices == [0, 1, 2] and plan.status["currentReplicas"] == 3


def test_after_a_create_refused_teardown_the_next_attempt_is_smaller() -> None:
    from phalanx.reconcile.plan import iso, parse_iso

    refused = {"type": "PodsCreated", "status": "False", "reason": "CreateRefused",
               "message": "exceeded quota", "lastTransitionTime": iso(NOW - 400)}  # fmt: skip
    status = {
        "attempt": 0,
        "sizedAttempt": 0,
        "phase": "Pending",
        "currentReplicas": 4,
        "conditions": [refused],
    }
    plan = decide(elastic_job_of(4, status), [sized(0, 4), sized(1, 4)], NODES, NOW, room=Room(pods=4))
    assert plan.status["attempt"] == 1 and sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1"]
    requeue = parse_iso(plan.status["requeueAfter"])
    assert requeue is not None
    again = decide(elastic_job_of(4, plan.status), [], NODES, requeue + 1, room=Room(pods=4))
    assert again.create_indices == [0, 1, 2]


def test_the_cap_lifts_after_its_cool_down() -> None:
    status, _ = timed_out_at_four()
    plan = decide(elastic_job_of(4, status), [], NODES, NOW + 3600, room=Room(pods=4))
    assert plan.create_indices == [0, 1, 2, 3]


def test_a_gang_does_not_grow_during_the_cool_down_after_a_gang_timeout() -> None:
    status, later = timed_out_at_four()
    created = decide(elastic_job_of(4, status), [], NODES, later, room=Room(pods=4)).status
    running = checkpointed({**created, **RUNNING, "attempt": 1, "createdAttempt": 1,
                            "admittedTime": created.get("admittedTime") or RUNNING["admittedTime"]})  # fmt: skip
    pods = [sized(i, 3, phase="Running", attempt=1) for i in range(3)]
    plan = decide(elastic_job_of(4, running), pods, NODES, later + 60, room=Room(pods=1))
    assert plan.status["phase"] == "Running" and not plan.delete_pods


def test_before_the_cluster_is_listed_a_new_attempt_waits_to_be_sized() -> None:
    # room None: the stores have not listed (the first pass after a start). Sizing now would read
    # no room and start at minReplicas when maxReplicas fits.
    plan = decide(elastic_job(), [], NODES, NOW, room=None)
    assert not plan.create_indices
    assert "currentReplicas" not in plan.status and "sizedAttempt" not in plan.status
    assert plan.recheck_after is not None and plan.recheck_after <= 5
    later = decide(elastic_job(plan.status), [], NODES, NOW + 1, room=Room(pods=2))
    assert later.create_indices == [0, 1] and later.status["currentReplicas"] == 2


def test_a_restart_to_grow_claims_the_room_it_grows_into() -> None:
    status = checkpointed({**RUNNING, "currentReplicas": 1})
    plan = decide(elastic_job(status), [pod(0)], NODES, NOW, room=Room(pods=1))
    # The new gang of 2, of which 1 beyond the pod it holds now (rules/elastic.py, admission_at_creation.py).
    assert plan.grow == (2, 1)
    waiting = decide(elastic_job(checkpointed({**RUNNING, "currentReplicas": 1})), [pod(0)], NODES, NOW,
                     room=Room(pods=0))  # fmt: skip
    assert waiting.grow is None


def test_the_room_is_read_only_for_a_decision_that_needs_it() -> None:
    from phalanx.reconcile.rules.elastic import room_needed

    assert room_needed(elastic_job(), [])  # a new attempt to size
    assert not room_needed(job(), [])  # not elastic
    sized_not_seen = {"attempt": 0, "sizedAttempt": 0, "currentReplicas": 1}
    assert not room_needed(elastic_job(sized_not_seen), [])  # sized already: its pods are on the way
    assert not room_needed(elastic_job({**RUNNING, "currentReplicas": 2}), [pod(0), pod(1)])  # whole
    below = {**RUNNING, "currentReplicas": 1}
    assert not room_needed(elastic_job(below), [pod(0)])  # no checkpoint since admission: cannot grow
    assert room_needed(elastic_job(checkpointed(below)), [pod(0)])  # a grow check
    capped = {**checkpointed(below), "elasticCap": {"replicas": 1, "until": "2099-01-01T00:00:00Z"}}
    assert not room_needed(elastic_job(capped), [pod(0)])


def test_the_cap_after_a_failed_start_is_cleared_when_the_job_succeeds() -> None:
    status = {**RUNNING, "currentReplicas": 2, "elasticCap": {"replicas": 1, "until": "2099-01-01T00:00:00Z"}}
    done = [pod(0, phase="Succeeded", exit_code=0), pod(1, phase="Succeeded", exit_code=0)]
    plan = decide(elastic_job(status), done, NODES, NOW)
    assert plan.status["phase"] == "Succeeded" and "elasticCap" not in plan.status


def world_size_exit(index: int, size: int) -> dict[str, Any]:
    """A pod of an attempt of `size` whose trainer found that world size unusable (exit 78)."""
    p = pod(index, phase="Failed", exit_code=78)
    p["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = (
        f"phalanx-trainer: world size unusable (world size {size}): data.global_batch_size ...\n"
    )
    p["metadata"]["labels"][GANG_SIZE] = str(size)
    return p


def test_an_unusable_world_size_is_kept_and_skipped_without_capping_the_sizes_above_it() -> None:
    status = {**RUNNING, "currentReplicas": 3, "sizedAttempt": 0}
    pods = [world_size_exit(0, 3), sized(1, 3, phase="Running"), sized(2, 3, phase="Running")]
    plan = decide(elastic_job_of(4, status), pods, NODES, NOW, room=Room(pods=1))
    assert plan.status["phase"] != "Failed" and plan.status["attempt"] == 1
    assert plan.status["elasticUnusableSizes"] == [3] and "elasticCap" not in plan.status
    assert plan.status["restarts"]["failures"] == 0  # not the job's failure: the size's
    warning = next(e for e in plan.events if e.reason == "WorldSizeUnusable")
    assert warning.type == "Warning"
    assert "3 pod(s)" in warning.message and "replicasMultipleOf" in warning.message
    below = decide(elastic_job_of(4, plan.status), [], NODES, NOW + 1, room=Room(pods=3))
    assert below.create_indices == [0, 1]  # room for 3: the size below it
    resized = next(e for e in below.events if e.reason == "Resized")
    assert "cannot use" in resized.message and "did not start" not in resized.message
    above = decide(elastic_job_of(4, plan.status), [], NODES, NOW + 1, room=Room(pods=4))
    assert above.create_indices == [0, 1, 2, 3]  # a larger size is not blocked


def test_growth_skips_an_unusable_size_but_grows_past_it() -> None:
    status = checkpointed({**RUNNING, "currentReplicas": 2, "elasticUnusableSizes": [3]})
    running = [sized(0, 2, phase="Running"), sized(1, 2, phase="Running")]
    stays = decide(elastic_job_of(4, status), running, NODES, NOW, room=Room(pods=1))
    assert stays.status["phase"] == "Running" and not stays.delete_pods  # to 3 only: unusable
    grows = decide(elastic_job_of(4, status), running, NODES, NOW, room=Room(pods=2))
    assert grows.status["phase"] == "Restarting" and grows.grow == (4, 2)


def test_an_unusable_min_replicas_with_larger_sizes_left_does_not_fail_the_job() -> None:
    status = {**RUNNING, "currentReplicas": 1, "sizedAttempt": 0}
    plan = decide(elastic_job_of(4, status), [world_size_exit(0, 1)], NODES, NOW, room=Room(pods=0))
    assert plan.status["phase"] == "Restarting" and plan.status["elasticUnusableSizes"] == [1]
    again = decide(elastic_job_of(4, plan.status), [], NODES, NOW + 1, room=Room(pods=1))
    assert again.create_indices == [0, 1]  # the smallest usable size: never the unusable one again


def test_an_unusable_world_size_with_no_usable_size_left_fails_the_job_naming_the_fix() -> None:
    status = {**RUNNING, "currentReplicas": 1, "sizedAttempt": 0, "elasticUnusableSizes": [2]}
    plan = decide(elastic_job_of(2, status), [world_size_exit(0, 1)], NODES, NOW, room=Room(pods=0))
    assert plan.status["phase"] == "Failed"
    assert "replicasMultipleOf" in plan.status["message"] or any(
        "replicasMultipleOf" in c.get("message", "") for c in plan.status["conditions"]
    )


def test_a_world_too_small_marks_every_size_up_to_it_and_never_steps_down() -> None:
    status = {**RUNNING, "currentReplicas": 2, "sizedAttempt": 0}
    p = world_size_exit(0, 2)
    p["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = (
        "phalanx-trainer: world size too small (world size 2): the smallest usable world size is 3\n"
    )
    plan = decide(elastic_job_of(4, status), [p, sized(1, 2, phase="Running")], NODES, NOW, room=Room(pods=0))
    assert plan.status["phase"] == "Restarting" and plan.status["elasticUnusableSizes"] == [1, 2]
    again = decide(elastic_job_of(4, plan.status), [], NODES, NOW + 1, room=Room(pods=1))
    assert again.create_indices == [0, 1, 2]  # the smallest size left; it waits for room for it


def test_a_new_attempt_waiting_for_the_cluster_list_says_so_in_pods_created() -> None:
    plan = decide(elastic_job(), [], NODES, NOW, room=None)
    created = next(c for c in plan.status["conditions"] if c["type"] == "PodsCreated")
    assert created["status"] == "False" and created["reason"] == "WaitingForClusterList"
    later = decide(elastic_job(plan.status), [], NODES, NOW + 1, room=Room(pods=2))
    created = next(c for c in later.status["conditions"] if c["type"] == "PodsCreated")
    assert created["reason"] != "WaitingForClusterList"
