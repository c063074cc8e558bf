"""Between attempts: waiting for the previous attempt's pods (reconcile/rules/restart.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import iso
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, not_ready_node, pod

pytestmark = pytest.mark.unit


def test_pods_of_the_previous_attempt_must_be_gone_before_new_ones_are_created() -> None:
    status = {"attempt": 1, "phase": "Restarting", "restarts": {"failures": 0, "preemptions": 1}}
    old = pod(0, attempt=0, metadata={"deletionTimestamp": iso(NOW)})
    plan = decide(job(status), [old], NODES, NOW)
    assert plan.create_indices == [] and plan.status["phase"] == "Restarting"
    plan = decide(job(status), [], NODES, NOW)
    assert plan.create_indices == [0, 1]


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
