"""Pod outcome classification and the gang verdict: one row per case of the contract."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.policy.pod_outcome import (
    GangVerdict,
    OutcomeKind,
    PodOutcome,
    VerdictKind,
    classify_pod,
    gang_verdict,
    missing_pod_outcome,
)

pytestmark = pytest.mark.unit

READY_NODE: dict[str, Any] = {
    "metadata": {"name": "node-a"},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}
NOT_READY_NODE: dict[str, Any] = {
    "metadata": {"name": "node-a"},
    "status": {
        "conditions": [{"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-11-30T10:00:00Z"}]
    },
}
T0 = "2026-11-30T10:00:00Z"
T0_EPOCH = 1_796_032_800.0


def terminated(code: int, reason: str = "Error", name: str = "trainer", at: str = T0) -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "reason": reason, "finishedAt": at}}}


def pod(
    phase: str,
    containers: list[dict[str, Any]] | None = None,
    disruption: str | None = None,
    deleting: bool = False,
    reason: str | None = None,
    node: str | None = "node-a",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "containerStatuses": containers or []}
    if disruption is not None:
        status["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": disruption, "lastTransitionTime": T0}
        ]
    if reason is not None:
        status["reason"] = reason
    metadata: dict[str, Any] = {"name": "job-worker-0", "namespace": "ns"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-30T10:00:30Z"
        metadata["deletionGracePeriodSeconds"] = 30
    spec: dict[str, Any] = {"containers": [{"name": "trainer"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": metadata, "spec": spec, "status": status}


def classify(
    raw: dict[str, Any],
    node: dict[str, Any] | None = READY_NODE,
    retryable: frozenset[int] = frozenset(),
) -> PodOutcome:
    return classify_pod(raw, retryable_exit_codes=retryable, node=node)


DISRUPTION_REASONS = [
    "PreemptionByScheduler",
    "PreemptionByKubeScheduler",
    "DeletionByTaintManager",
    "EvictionByEvictionAPI",
    "DeletionByPodGC",
    "TerminationByKubelet",
]


@pytest.mark.parametrize(
    ("raw", "kind", "reason", "code"),
    [
        (pod("Pending", node=None), OutcomeKind.PENDING, "Pending", None),
        (pod("Running"), OutcomeKind.RUNNING, "Running", None),
        (pod("Succeeded", [terminated(0, "Completed")]), OutcomeKind.SUCCEEDED, "Completed", 0),
        (pod("Failed", [terminated(75)]), OutcomeKind.PREEMPTED, "CheckpointedOnSigterm", 75),
        (pod("Failed", [terminated(1)]), OutcomeKind.FAILED_PERMANENT, "ExitCode", 1),
        (pod("Failed", [terminated(127)]), OutcomeKind.FAILED_PERMANENT, "ExitCode", 127),
        (pod("Failed", [terminated(128)]), OutcomeKind.FAILED_RETRYABLE, "ExitCode", 128),
        (pod("Failed", [terminated(143)]), OutcomeKind.FAILED_RETRYABLE, "ExitCode", 143),
        (pod("Failed", [terminated(255)]), OutcomeKind.FAILED_RETRYABLE, "ExitCode", 255),
        (pod("Failed", [terminated(137, "OOMKilled")]), OutcomeKind.FAILED_RETRYABLE, "OOMKilled", 137),
        (pod("Failed", reason="Evicted"), OutcomeKind.PREEMPTED, "Evicted", None),
        (pod("Failed", reason="NodeShutdown"), OutcomeKind.PREEMPTED, "NodeShutdown", None),
        (pod("Failed"), OutcomeKind.PREEMPTED, "Evicted", None),
        (pod("Failed", reason="DeadlineExceeded"), OutcomeKind.FAILED_PERMANENT, "DeadlineExceeded", None),
        (pod("Running", deleting=True), OutcomeKind.PREEMPTED, "Deleted", None),
        (pod("Unknown", node="node-a"), OutcomeKind.PENDING, "PhaseUnknown", None),
    ],
)
def test_classification_table(raw: dict[str, Any], kind: OutcomeKind, reason: str, code: int | None) -> None:
    outcome = classify(raw)
    assert (outcome.kind, outcome.reason, outcome.exit_code) == (kind, reason, code)
    assert outcome.pod == "job-worker-0" and outcome.message


def test_listed_exit_codes_become_retryable() -> None:
    assert (
        classify(pod("Failed", [terminated(3)]), retryable=frozenset({3})).kind
        is OutcomeKind.FAILED_RETRYABLE
    )
    assert (
        classify(pod("Failed", [terminated(4)]), retryable=frozenset({3})).kind
        is OutcomeKind.FAILED_PERMANENT
    )


def test_a_restart_generation_that_broke_is_retryable_as_the_trainer_contract_says() -> None:
    # The resident launcher exits 76 when a generation broke without a checkpoint (a peer lost, or
    # no new generation came in time): a failure to restart from, never a permanent one.
    from phalanx_trainer import contract

    outcome = classify(pod("Failed", [terminated(contract.EXIT_GENERATION_FAILED)]))
    assert outcome.kind is OutcomeKind.FAILED_RETRYABLE
    assert "restart generation" in outcome.message


@pytest.mark.parametrize("reason", DISRUPTION_REASONS)
def test_every_disruption_reason_on_a_stopped_pod_is_a_preemption(reason: str) -> None:
    failed = classify(pod("Failed", [terminated(143)], disruption=reason))
    assert (failed.kind, failed.reason, failed.at) == (OutcomeKind.PREEMPTED, reason, T0_EPOCH)
    deleting = classify(pod("Running", disruption=reason, deleting=True))
    assert (deleting.kind, deleting.reason) == (OutcomeKind.PREEMPTED, reason)


@pytest.mark.parametrize("reason", DISRUPTION_REASONS)
def test_disruption_condition_on_a_running_pod_restarts_nothing(reason: str) -> None:
    outcome = classify(pod("Running", disruption=reason))
    assert outcome.kind is OutcomeKind.RUNNING
    assert "DisruptionTarget" in outcome.message


def test_condition_set_then_cleared_is_just_running() -> None:
    raw = pod("Running")
    raw["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "False", "reason": "PreemptionByScheduler"}
    ]
    assert classify(raw).kind is OutcomeKind.RUNNING


def test_a_deletion_by_someone_else_is_a_disruption() -> None:
    outcome = classify(pod("Running", deleting=True))
    # The deletion was requested grace-period seconds before the deletionTimestamp deadline.
    assert (outcome.kind, outcome.at) == (OutcomeKind.PREEMPTED, T0_EPOCH)


@pytest.mark.parametrize(
    ("raw", "node", "lost"),
    [
        (pod("Failed", [terminated(137)]), None, True),
        (pod("Unknown"), NOT_READY_NODE, True),
        (pod("Running", deleting=True), NOT_READY_NODE, False),  # someone deleted it: "Deleted"
        (pod("Failed", [terminated(137)]), NOT_READY_NODE, True),
        (pod("Running"), NOT_READY_NODE, False),  # not lost until the pod is failed or being removed
        (pod("Failed", [terminated(137)]), READY_NODE, False),
    ],
)
def test_node_lost(raw: dict[str, Any], node: dict[str, Any] | None, lost: bool) -> None:
    outcome = classify(raw, node=node)
    assert (outcome.reason == "NodeLost") is lost
    if lost:
        assert outcome.kind is OutcomeKind.PREEMPTED


def test_checkpoint_exit_wins_over_a_sidecar_killed_at_the_same_time() -> None:
    raw = pod("Failed", [terminated(137, name="log-shipper"), terminated(75)])
    assert classify(raw).kind is OutcomeKind.PREEMPTED


def test_trainer_exit_code_decides_over_other_containers() -> None:
    raw = pod("Failed", [terminated(2, name="sidecar"), terminated(139)])
    assert (classify(raw).kind, classify(raw).exit_code) == (OutcomeKind.FAILED_RETRYABLE, 139)


def test_failed_init_container_is_classified_by_its_exit_code() -> None:
    raw = pod("Failed")
    raw["status"]["initContainerStatuses"] = [terminated(1, name="fetch-data")]
    outcome = classify(raw)
    assert (outcome.kind, outcome.exit_code) == (OutcomeKind.FAILED_PERMANENT, 1)
    assert "fetch-data" in outcome.message


def test_trainer_that_died_while_a_sidecar_keeps_the_pod_running_is_a_failure() -> None:
    raw = pod("Running", [terminated(1), {"name": "sidecar", "state": {"running": {}}}])
    assert classify(raw).kind is OutcomeKind.FAILED_PERMANENT


def test_gated_pod_says_it_waits_for_admission() -> None:
    raw = pod("Pending", node=None)
    raw["spec"]["schedulingGates"] = [{"name": "phalanx.dev/gang"}]
    assert classify(raw).message == "waiting for admission"


def outcome(kind: OutcomeKind, name: str, at: float | None = None, reason: str = "r") -> PodOutcome:
    return PodOutcome(name, kind, reason, f"{name} {reason}", None, at)


def verdict(*outcomes: PodOutcome) -> GangVerdict:
    return gang_verdict(list(outcomes))


def test_verdict_all_succeeded() -> None:
    v = verdict(outcome(OutcomeKind.SUCCEEDED, "a"), outcome(OutcomeKind.SUCCEEDED, "b"))
    assert (v.kind, v.succeeded) == (VerdictKind.SUCCEEDED, 2)


def test_verdict_permanent_failure_fails_the_job_with_the_first_reason() -> None:
    # Both permanent failures came well before the retryable one: not its cascade.
    v = verdict(
        outcome(OutcomeKind.FAILED_RETRYABLE, "a", 20.0),
        outcome(OutcomeKind.FAILED_PERMANENT, "b", 9.0, "late"),
        outcome(OutcomeKind.FAILED_PERMANENT, "c", 7.0, "early"),
    )
    assert (v.kind, v.reason, v.pod) == (VerdictKind.FAILED, "early", "c")


def test_verdict_a_crash_after_a_peer_was_killed_is_its_cascade_and_the_gang_restarts() -> None:
    # A fresh-clone CI run: worker-1 SIGKILLed (137), worker-0's all-reduce then failed with
    # "Connection reset by peer" (exit 1), both seen in one reconcile: the job failed. The peer's
    # death caused the crash; the restart spends the failure budget, and a genuine bug recurs.
    v = verdict(
        outcome(OutcomeKind.FAILED_RETRYABLE, "w1", 100.0, "ExitCode"),
        outcome(OutcomeKind.FAILED_PERMANENT, "w0", 100.4, "ExitCode"),
    )
    assert (v.kind, v.pod) == (VerdictKind.RESTART_FAILURE, "w1")


def test_verdict_preemption_beats_failures_caused_by_the_teardown() -> None:
    v = verdict(
        outcome(OutcomeKind.PREEMPTED, "a", 100.0, "PreemptionByScheduler"),
        outcome(OutcomeKind.FAILED_RETRYABLE, "b", 101.0),  # SIGTERM'd survivor, exit 143
        outcome(OutcomeKind.FAILED_PERMANENT, "c", 103.0),  # rank crashed with exit 1 when its peer vanished
    )
    assert (v.kind, v.reason, v.pod) == (VerdictKind.RESTART_PREEMPTION, "PreemptionByScheduler", "a")


def test_verdict_permanent_failure_before_any_preemption_still_fails() -> None:
    v = verdict(outcome(OutcomeKind.FAILED_PERMANENT, "c", 50.0), outcome(OutcomeKind.PREEMPTED, "a", 100.0))
    assert v.kind is VerdictKind.FAILED


def test_verdict_preemption_of_unknown_time_covers_every_failure() -> None:
    v = verdict(outcome(OutcomeKind.FAILED_PERMANENT, "c", 50.0), missing_pod_outcome("a"))
    assert (v.kind, v.reason) == (VerdictKind.RESTART_PREEMPTION, "Deleted")


def test_verdict_retryable_failure_restarts_as_a_failure() -> None:
    v = verdict(
        outcome(OutcomeKind.RUNNING, "a"), outcome(OutcomeKind.FAILED_RETRYABLE, "b", 3.0, "OOMKilled")
    )
    assert (v.kind, v.reason, v.running) == (VerdictKind.RESTART_FAILURE, "OOMKilled", 1)


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        ([OutcomeKind.RUNNING, OutcomeKind.RUNNING], VerdictKind.RUNNING),
        ([OutcomeKind.RUNNING, OutcomeKind.SUCCEEDED], VerdictKind.RUNNING),
        ([OutcomeKind.RUNNING, OutcomeKind.PENDING], VerdictKind.PENDING),
        ([], VerdictKind.PENDING),
    ],
)
def test_verdict_without_failures(kinds: list[OutcomeKind], expected: VerdictKind) -> None:
    assert gang_verdict([outcome(k, f"p{i}") for i, k in enumerate(kinds)]).kind is expected


def test_classified_pods_fold_into_a_preemption_end_to_end() -> None:
    victim = pod("Failed", [terminated(143, at="2026-11-30T10:00:20Z")], disruption="PreemptionByScheduler")
    peer = pod("Failed", [terminated(1, at="2026-11-30T10:00:25Z")])
    peer["metadata"]["name"] = "job-worker-1"
    outcomes = [classify(victim), classify(peer)]
    assert [o.kind for o in outcomes] == [OutcomeKind.PREEMPTED, OutcomeKind.FAILED_PERMANENT]
    assert gang_verdict(outcomes).kind is VerdictKind.RESTART_PREEMPTION


def exit_78(name: str = "trainer", message: str = "") -> dict[str, Any]:
    container = terminated(78, name=name)
    container["state"]["terminated"]["message"] = message
    return container


# As the trainer's stderr reaches the termination message (FallbackToLogsOnError).
MARKED = "phalanx-trainer: world size unusable (world size 5): data.global_batch_size 96 ...\n"


def test_exit_78_with_the_trainers_marker_is_an_unusable_world_size() -> None:
    outcome = classify(pod("Failed", [exit_78(message=MARKED)]))
    assert outcome.reason == "WorldSizeUnusable" and outcome.kind is OutcomeKind.FAILED_PERMANENT


@pytest.mark.parametrize(
    "container",
    [exit_78(message="user script: bad config\n"), exit_78(name="sidecar", message=MARKED)],
    ids=["trainer-without-marker", "another-container"],
)
def test_exit_78_without_the_trainers_marker_is_an_ordinary_exit_code(container: dict[str, Any]) -> None:
    # 78 is os.EX_CONFIG: user scripts and sidecars exit with it too
    outcome = classify(pod("Failed", [container]))
    assert outcome.reason == "ExitCode" and outcome.kind is OutcomeKind.FAILED_PERMANENT


def test_retryable_exit_codes_are_read_before_the_world_size_marker() -> None:
    outcome = classify(pod("Failed", [exit_78(message=MARKED)]), retryable=frozenset({78}))
    assert outcome.kind is OutcomeKind.FAILED_RETRYABLE


def test_exit_78_for_a_world_too_small_says_so() -> None:
    message = "phalanx-trainer: world size too small (world size 2): the smallest usable world size is 4\n"
    outcome = classify(pod("Failed", [exit_78(message=message)]))
    assert outcome.reason == "WorldSizeTooSmall" and "smallest usable world size is 4" in outcome.message
