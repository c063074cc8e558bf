"""Nodes a job keeps off after two infrastructure failures there (policy/bad_nodes.py), the device
errors that count as one (policy/pod_outcome.py), and rules/bad_nodes.py + rules/creation.py."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.policy.bad_nodes import FAILURES_TO_AVOID, REMEMBER_SECONDS, avoided, prune, record
from phalanx.policy.pod_outcome import REASON_DEVICE_ERROR, OutcomeKind, classify_pod, device_error
from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_a_node_is_avoided_at_its_second_failure_and_not_at_its_first() -> None:
    once, newly = record(None, [("gpu-3", "NodeLost")], NOW)
    assert newly == [] and avoided(once, NOW) == []
    twice, newly = record(once, [("gpu-3", "DeviceError")], NOW + 60)
    assert newly == ["gpu-3"] and avoided(twice, NOW + 61) == ["gpu-3"]
    (entry,) = twice
    assert entry["failures"] == FAILURES_TO_AVOID and entry["reasons"] == ["NodeLost", "DeviceError"]
    # A third failure keeps it avoided but is no news.
    _, newly = record(twice, [("gpu-3", "Hang")], NOW + 120)
    assert newly == []


def test_avoidance_and_the_record_expire() -> None:
    twice, _ = record(record(None, [("gpu-3", "NodeLost")], NOW)[0], [("gpu-3", "NodeLost")], NOW)
    assert avoided(twice, NOW + REMEMBER_SECONDS - 1) == ["gpu-3"]
    assert avoided(twice, NOW + REMEMBER_SECONDS + 1) == []
    assert prune(twice, NOW + REMEMBER_SECONDS + 1) == []
    # A failure long after the first one starts the count again.
    again, newly = record(twice, [("gpu-3", "NodeLost")], NOW + REMEMBER_SECONDS + 5)
    assert newly == [] and again[0]["failures"] == 1


@pytest.mark.parametrize(
    "message",
    [
        "RuntimeError: CUDA error: unspecified launch failure\nNVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
        "torch.cuda.OutOfMemoryError? no: uncorrectable ECC error encountered",
        "NCCL WARN NVLink error detected on link 3",
    ],
)
def test_device_errors_in_the_termination_message_are_retryable_and_named(message: str) -> None:
    assert device_error(message) is not None
    failed = {"metadata": {"name": "w"}, "spec": {"nodeName": "n0"}, "status": {"phase": "Failed",
              "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": message}}}]}}  # fmt: skip
    outcome = classify_pod(failed, node=NODES["n0"])
    assert outcome.kind is OutcomeKind.FAILED_RETRYABLE and outcome.reason == REASON_DEVICE_ERROR


def test_a_code_error_is_no_device_error() -> None:
    assert device_error("ValueError: shapes (8, 64) and (32, 64) not aligned") is None


def device_failure(index: int, node: str = "n0", attempt: int = 0) -> dict[str, Any]:
    return pod(index, attempt=attempt, phase="Failed", exit_code=1, spec={"nodeName": node},
               status={"containerStatuses": [{"name": "trainer", "state": {"terminated": {
                   "exitCode": 1, "message": "NVRM: Xid 79: GPU has fallen off the bus"}}}]})  # fmt: skip


def test_a_device_error_restart_books_the_node_and_the_second_one_keeps_the_next_pods_off_it() -> None:
    spec = {"runPolicy": {"backoffLimit": 5}}
    first = decide(job(dict(RUNNING), **spec), [pod(0), device_failure(1)], NODES, NOW)
    assert first.status["restarts"]["failures"] == 1
    assert first.status["badNodes"][0]["node"] == "n0" and "avoidedUntil" not in first.status["badNodes"][0]
    second_running = {**first.status, "phase": "Running", "createdAttempt": 1}
    second = decide(
        job(second_running, **spec), [pod(0, attempt=1), device_failure(1, attempt=1)], NODES, NOW + 30
    )
    (entry,) = second.status["badNodes"]
    assert entry["failures"] == 2 and entry["reasons"] == ["DeviceError", "DeviceError"]
    assert [e.reason for e in second.events if e.reason == "BadNode"] == ["BadNode"]
    # The next attempt's pods are created off n0.
    creating = {**second.status, "phase": "Restarting"}
    plan = decide(job(creating, **spec), [], NODES, NOW + 40)
    assert plan.create_indices == [0, 1] and plan.avoid_nodes == ["n0"]


def test_a_preemption_books_no_node() -> None:
    evicted = pod(1, metadata={"deletionTimestamp": "2027-01-15T08:00:00Z"})
    plan = decide(job(dict(RUNNING)), [pod(0), evicted], NODES, NOW)
    assert plan.status["restarts"]["preemptions"] == 1 and "badNodes" not in plan.status
