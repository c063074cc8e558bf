"""Gang timeout after admission and for a gang created only in part (reconcile/rules/gang_timeout.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, job, pod, refused_at

pytestmark = pytest.mark.unit


def test_gang_timeout_tears_down_and_requeues_with_backoff() -> None:
    admitted = {"attempt": 0, "createdAttempt": 0, "phase": "Admitted", "admittedTime": iso(NOW - 400)}
    plan = decide(job(admitted), [pod(0), pod(1, phase="Pending", spec={"nodeName": ""})], NODES, NOW)
    assert plan.status["gangTimeouts"] == 1 and plan.status["attempt"] == 1
    assert plan.status["requeueAfter"] == iso(NOW + 10)
    assert set(plan.delete_pods) == {"j-worker-0", "j-worker-1"}
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 0}
    plan = decide(job(dict(plan.status)), [], NODES, NOW + 5)
    assert plan.create_indices == [] and plan.status["phase"] == "Pending"


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
