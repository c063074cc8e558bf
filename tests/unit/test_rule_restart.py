"""Between attempts: waiting for the previous attempt's pods (reconcile/rules/restart.py)."""

from __future__ import annotations

from typing import Any

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


NEVER = "can never fit: needs 2 pods x 8 nvidia.com/gpu; only 1 node can ever host one"


def gated_avoiding(index: int, avoided: str) -> dict[str, Any]:
    """A pod of attempt 1 built to keep off `avoided` (its annotation says so), still gated."""
    from phalanx.constants import ANNOTATION_AVOIDED_NODES, GANG_SCHEDULING_GATE

    made = pod(index, attempt=1, phase="Pending", metadata={"annotations": {ANNOTATION_AVOIDED_NODES: avoided}},
               spec={"nodeName": None, "schedulingGates": [{"name": GANG_SCHEDULING_GATE}]})  # fmt: skip
    made["metadata"]["name"] = f"j-worker-{index}-a1"
    return made


def test_a_gang_kept_off_a_lost_node_is_rebuilt_once_the_node_is_back_and_its_old_pods_gone() -> None:
    # Two nodes, one lost with the old pod lingering: the next attempt was built to avoid it, so with
    # only one node left it waits ("can never fit"). The node comes back and the old pod goes; built
    # as they are, the gated pods would still refuse that node and wait forever (bench/node_loss_bench.py).
    status = {**RUNNING, "attempt": 1, "createdAttempt": 1, "phase": "Pending", "admissionMessage": NEVER,
              "restarts": {"failures": 0, "preemptions": 1}}  # fmt: skip
    gated = [gated_avoiding(0, "silent"), gated_avoiding(1, "silent")]
    nodes = {**NODES, "silent": NODES["n0"]}  # Ready again
    plan = decide(job(dict(status)), gated, nodes, NOW)
    # Only while unchanged (the admission pass may be lifting their gates), and counted nowhere.
    assert sorted(plan.delete_unchanged_pods) == ["j-worker-0-a1", "j-worker-1-a1"] and not plan.delete_pods
    assert [e.reason for e in plan.events].count("AvoidanceLifted") == 1
    assert plan.status["attempt"] == 1 and plan.status["restarts"] == {"failures": 0, "preemptions": 1}
    assert plan.status.get("createdAttempt") != 1  # rebuilt by creation once they are gone
    rebuilt = decide(job(dict(plan.status)), [], nodes, NOW + 1)
    assert rebuilt.create_indices == [0, 1] and rebuilt.avoid_nodes == []


def test_a_gang_kept_off_a_node_where_an_old_pod_still_lingers_keeps_waiting() -> None:
    nodes = {**NODES, "silent": not_ready_node("silent", NOW - 60)}
    status = {**RUNNING, "attempt": 1, "createdAttempt": 1, "phase": "Pending", "admissionMessage": NEVER,
              "restarts": {"failures": 0, "preemptions": 1}}  # fmt: skip
    lingering = pod(1, spec={"nodeName": "silent"}, metadata={"deletionTimestamp": iso(NOW - 30)})
    gated = [gated_avoiding(0, "silent"), gated_avoiding(1, "silent")]
    plan = decide(job(dict(status)), [lingering, *gated], nodes, NOW)
    assert not plan.delete_unchanged_pods
    assert not set(plan.delete_pods) & {"j-worker-0-a1", "j-worker-1-a1"}


def test_a_gang_that_can_fit_as_built_or_is_being_rebuilt_is_left_alone() -> None:
    status = {**RUNNING, "attempt": 1, "createdAttempt": 1, "phase": "Pending",
              "restarts": {"failures": 0, "preemptions": 1}}  # fmt: skip
    nodes = {**NODES, "silent": NODES["n0"]}
    gated = [gated_avoiding(0, "silent"), gated_avoiding(1, "silent")]
    waiting = decide(job({**status, "admissionMessage": "waiting behind 2 gang(s)"}), gated, nodes, NOW)
    assert not waiting.delete_unchanged_pods  # it waits its turn as it is
    going = [{**p, "metadata": {**p["metadata"], "deletionTimestamp": iso(NOW)}} for p in gated]
    again = decide(job({**status, "createdAttempt": None, "admissionMessage": NEVER}), going, nodes, NOW)
    assert not again.delete_unchanged_pods and not again.create_indices and not again.events


def test_pods_built_to_avoid_nodes_say_so_and_a_templates_copy_of_the_annotation_is_dropped() -> None:
    from phalanx.api.schema import parse
    from phalanx.api.v1alpha1 import TrainingJobSpec
    from phalanx.builders.pods import JobRef, build_worker_pod
    from phalanx.constants import ANNOTATION_AVOIDED_NODES

    spec = parse(TrainingJobSpec, job()["spec"])
    ref = JobRef(namespace="ns", name="j", uid="u")
    template = {
        "metadata": {"annotations": {ANNOTATION_AVOIDED_NODES: "n9"}},
        "spec": {"containers": [{"name": "trainer"}]},
    }
    plain = build_worker_pod(ref, spec, 0, 1, template)
    assert ANNOTATION_AVOIDED_NODES not in plain["metadata"].get("annotations", {})  # else a rebuild loop
    avoiding = build_worker_pod(ref, spec, 0, 1, template, avoid_nodes=["b", "a"])
    assert avoiding["metadata"]["annotations"][ANNOTATION_AVOIDED_NODES] == "a,b"
