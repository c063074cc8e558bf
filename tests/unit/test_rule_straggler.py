"""rules/straggler.py: the trainer's stragglers reach status with their pod and node, and clear."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

NODES = {**NODES, "gpu-node-7": {**NODES["n0"], "metadata": {"name": "gpu-node-7"}}}

pytestmark = pytest.mark.unit

# 2 pods x 2 processes: global rank 3 runs in worker-1.
SPEC = {"procsPerReplica": 2}


def pods() -> list[dict[str, Any]]:
    return [pod(0), pod(1, spec={"nodeName": "gpu-node-7"})]


def report(stragglers: list[dict[str, Any]], attempt: int = 0) -> dict[str, Any]:
    return {"attempt": attempt, "stragglers": stragglers}


def test_a_reported_straggler_gets_the_condition_naming_its_pod_and_node_and_one_event() -> None:
    plan = decide(job(dict(RUNNING), **SPEC), pods(), NODES, NOW,
                  trainer_report=report([{"rank": 3, "ratio": 2.43, "steps": 20}]))  # fmt: skip
    assert plan.status["stragglers"] == [
        {"rank": 3, "pod": "j-worker-1", "node": "gpu-node-7", "ratio": "2.4", "steps": 20}
    ]
    condition = next(c for c in plan.status["conditions"] if c["type"] == "Straggler")
    assert condition["status"] == "True" and condition["reason"] == "SlowRank"
    assert "rank 3 (pod j-worker-1 on node gpu-node-7) 2.4x" in condition["message"]
    assert [e.reason for e in plan.events if e.type == "Warning"] == ["Straggler"]
    # The same straggler again: the status stays, no new event.
    again = decide(job(plan.status, **SPEC), pods(), NODES, NOW + 1,
                   trainer_report=report([{"rank": 3, "ratio": 2.5, "steps": 21}]))  # fmt: skip
    assert not [e for e in again.events if e.reason == "Straggler"]


def test_the_condition_clears_when_the_trainer_reports_none() -> None:
    first = decide(job(dict(RUNNING), **SPEC), pods(), NODES, NOW,
                   trainer_report=report([{"rank": 3, "ratio": 2.43, "steps": 20}]))  # fmt: skip
    plan = decide(job(first.status, **SPEC), pods(), NODES, NOW + 5, trainer_report=report([]))
    assert "stragglers" not in plan.status
    condition = next(c for c in plan.status["conditions"] if c["type"] == "Straggler")
    assert condition["status"] == "False"


def test_a_healthy_job_never_gets_the_condition() -> None:
    plan = decide(job(dict(RUNNING), **SPEC), pods(), NODES, NOW, trainer_report=report([]))
    assert not any(c["type"] == "Straggler" for c in plan.status["conditions"])


@pytest.mark.parametrize(
    "bad",
    [[{"rank": "3", "ratio": 2.0, "steps": 1}], [{"rank": 3, "ratio": "x", "steps": 1}], ["rank 3"], [{}]],
)
def test_malformed_entries_from_a_user_image_are_left_out(bad: list[Any]) -> None:
    plan = decide(job(dict(RUNNING), **SPEC), pods(), NODES, NOW, trainer_report=report(bad))
    assert "stragglers" not in plan.status


def test_a_report_of_an_earlier_attempt_says_nothing_of_this_one() -> None:
    status = {**RUNNING, "attempt": 1}
    plan = decide(job(status, **SPEC), [pod(0, attempt=1), pod(1, attempt=1)], NODES, NOW,
                  trainer_report=report([{"rank": 3, "ratio": 2.4, "steps": 20}], attempt=0))  # fmt: skip
    assert "stragglers" not in plan.status
