"""rules/hang.py: a running gang with no new step within the bound restarts, reason Hang."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.reconcile.lifecycle import decide
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit

PODS = [pod(0), pod(1)]


def stalled(seconds: float, **extra: Any) -> dict[str, Any]:
    """Rank 0's report: attempt 0 trained up to step 40, last seen moving `seconds` ago."""
    return {"attempt": 0, "step": 40, "step_seen_at": NOW - seconds, "total_steps": 100,
            "seconds_per_step": 0.5, "startup": {"first_step": "2027-01-15T08:00:00.000Z"}, **extra}  # fmt: skip


def test_a_gang_stalled_past_the_bound_restarts_with_reason_hang_naming_the_silent_pod() -> None:
    spec = {"runPolicy": {"hangTimeoutSeconds": 30}}
    plan = decide(job(dict(RUNNING), **spec), PODS, NODES, NOW,
                  trainer_report=stalled(31, silent_pods=["j-worker-1"]))  # fmt: skip
    assert plan.status["phase"] == "Restarting" and plan.status["attempt"] == 1
    assert plan.status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 1}
    restarting = next(c for c in plan.status["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "Hang" and "j-worker-1" in restarting["message"]
    assert sorted(plan.delete_pods) == ["j-worker-0", "j-worker-1"]
    assert any(e.reason == "Hang" and e.type == "Warning" for e in plan.events)


def test_within_the_bound_nothing_happens_but_a_look_again_when_it_would_pass() -> None:
    spec = {"runPolicy": {"hangTimeoutSeconds": 30}}
    plan = decide(job(dict(RUNNING), **spec), PODS, NODES, NOW, trainer_report=stalled(20))
    assert plan.status["phase"] == "Running" and not plan.delete_pods
    assert plan.recheck_after is not None and plan.recheck_after <= 10


def test_hangs_spend_the_failure_budget_with_failures() -> None:
    status = {**RUNNING, "restarts": {"failures": 1, "preemptions": 4, "hangs": 1}}
    spec = {"runPolicy": {"hangTimeoutSeconds": 30, "backoffLimit": 2}}
    plan = decide(job(status, **spec), PODS, NODES, NOW, trainer_report=stalled(31))
    assert plan.status["phase"] == "Failed"
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "no training step" in failed["message"]


def test_a_retryable_failure_after_hangs_is_judged_against_the_same_budget() -> None:
    status = {**RUNNING, "restarts": {"failures": 0, "preemptions": 0, "hangs": 2}}
    plan = decide(job(status, runPolicy={"backoffLimit": 2}), [pod(0), pod(1, phase="Failed", exit_code=137)],
                  NODES, NOW)  # fmt: skip
    assert plan.status["phase"] == "Failed"


def test_a_pod_verdict_comes_before_a_hang() -> None:
    # A worker that died explains the stall: it is a failure, not a hang.
    spec = {"runPolicy": {"hangTimeoutSeconds": 30}}
    plan = decide(job(dict(RUNNING), **spec), [pod(0), pod(1, phase="Failed", exit_code=137)], NODES, NOW,
                  trainer_report=stalled(300))  # fmt: skip
    assert plan.status["restarts"]["failures"] == 1 and not plan.status["restarts"].get("hangs")


def test_a_report_of_the_previous_attempt_is_no_hang_of_this_one() -> None:
    status = {**RUNNING, "attempt": 1}
    plan = decide(job(status, runPolicy={"hangTimeoutSeconds": 30}), [pod(0, attempt=1), pod(1, attempt=1)],
                  NODES, NOW, trainer_report=stalled(300))  # fmt: skip
    assert plan.status["phase"] == "Running"


def test_at_the_30_s_pace_the_restart_names_the_silent_pod_and_books_its_node() -> None:
    # From the review (issue 17): at >= 600 jobs the poll 30 s after the last new step is the first
    # to find the stall; it starts the probe, and a reconcile right after it judged before the probe
    # answered: "every pod still answers", no bad node. It waits for the probe (it wakes the job).
    spec = {"runPolicy": {"hangTimeoutSeconds": 10}}
    pods = [pod(0), pod(1, spec={"nodeName": "n1"})]
    report = stalled(31, polled_at=NOW - 1, next_poll_after=30.0)
    nodes = {**NODES, "n1": {**NODES["n0"], "metadata": {"name": "n1"}}}
    plan = decide(job(dict(RUNNING), **spec), pods, nodes, NOW, trainer_report=report)
    assert plan.status["phase"] == "Running" and not plan.delete_pods
    assert plan.recheck_after is not None and plan.recheck_after <= 10
    probed = {**report, "silent_pods": ["j-worker-1"]}
    plan = decide(job(dict(RUNNING), **spec), pods, nodes, NOW + 2, trainer_report=probed)
    restarting = next(c for c in plan.status["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "Hang" and "not answering: j-worker-1" in restarting["message"]
    assert [entry["node"] for entry in plan.status["badNodes"]] == ["n1"]
