"""Pods on lost and vanished nodes (reconcile/rules/node_loss.py, housekeeping.py, observed.py)."""

from __future__ import annotations

import pytest

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.observed import Observed
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, not_ready_node, pod

pytestmark = pytest.mark.unit


def test_pods_on_a_deleted_node_are_lost_at_once_and_removed_without_grace() -> None:
    on_gone_node = pod(1, spec={"nodeName": "gone"})
    plan = decide(job(dict(RUNNING)), [pod(0), on_gone_node], NODES, NOW)
    assert plan.status["restarts"]["preemptions"] == 1 and plan.status["phase"] == "Restarting"
    assert plan.force_delete_pods == ["j-worker-1"]


def test_an_empty_node_cache_never_counts_as_node_loss() -> None:
    plan = decide(job(dict(RUNNING)), [pod(0), pod(1, spec={"nodeName": "gone"})], {}, NOW)
    assert plan.status["phase"] == "Running" and plan.force_delete_pods == []


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


def test_only_the_nodes_the_jobs_pods_are_on_are_judged_lost() -> None:
    # A reconcile judged every node of the cluster (1,000 in the steady-state bench) for the few its
    # pods are on; a node lost elsewhere is another job's business and leaves this gang running.
    nodes = {
        **NODES,
        "silent": not_ready_node("silent", NOW - 25),
        **{f"elsewhere-{i}": not_ready_node(f"elsewhere-{i}", NOW - 25) for i in range(3)},
    }
    pods = [pod(0), pod(1, spec={"nodeName": "silent"})]
    seen = Observed(spec=parse(TrainingJobSpec, job()["spec"]), attempt=0, pods=pods, nodes=nodes, now=NOW,
                    node_lost_after=20)  # fmt: skip
    assert seen.lost_nodes == frozenset({"silent"})
    plan = decide(job(dict(RUNNING)), [pod(0), pod(1)], nodes, NOW)
    assert plan.status["phase"] == "Running" and plan.delete_pods == []
