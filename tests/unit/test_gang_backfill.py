"""ETA-aware backfill: what it reads (gang/backfill.py) and what plan_admission does with it."""

from __future__ import annotations

import math

import pytest

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.gang.admission import plan_admission
from phalanx.gang.backfill import estimate_seconds, job_end, node_free_at
from tests.unit.test_gang_admission import gang, gpu_node

pytestmark = pytest.mark.unit

NOW = 1000.0


def spec(**scheduling: object) -> TrainingJobSpec:
    return parse(TrainingJobSpec, {"replicas": 1, "scheduling": scheduling,
                                   "template": {"spec": {"containers": [{"name": "trainer"}]}}})  # fmt: skip


def test_a_running_job_ends_at_its_eta_and_one_without_never() -> None:
    assert job_end({"phase": "Running", "progress": {"etaSeconds": 120}}, NOW) == NOW + 120
    assert job_end({"phase": "Running", "progress": {}}, NOW) == math.inf
    assert job_end({"phase": "Restarting", "progress": {"etaSeconds": 5}}, NOW) == math.inf


def test_a_node_is_free_when_its_last_job_ends_and_never_with_a_pod_of_someone_else() -> None:
    ends = {"ns/a": NOW + 50, "ns/b": NOW + 80}
    free_at = node_free_at([("n0", "ns/a"), ("n0", "ns/b"), ("n1", "ns/a"), ("n2", None)], ends)
    assert free_at == {"n0": NOW + 80, "n1": NOW + 50, "n2": math.inf}


def test_the_estimate_is_the_spec_hint_else_the_steps_left_at_the_measured_pace() -> None:
    assert estimate_seconds(spec(expectedRunSeconds=600), {}) == 600
    ran_before = {
        "progress": {"totalSteps": 1000},
        "lastCheckpoint": {"step": 400},
        "goodput": {"stepMilliseconds": 250},
    }
    assert estimate_seconds(spec(), ran_before) == pytest.approx(150.0)
    assert estimate_seconds(spec(), {}) is None


def blocked_head_and_a_short_job(estimate: float | None) -> list[str]:
    """node-0 and node-1 each run a job with 4 of 8 GPUs, ending at +100 s; the head needs both
    nodes whole. A 1-pod, 4-GPU gang behind it asks for the free half of a reserved node."""
    nodes = [gpu_node("node-0"), gpu_node("node-1")]
    used = {"node-0": {"nvidia.com/gpu": 4}, "node-1": {"nvidia.com/gpu": 4}}
    head = gang("head", 2, 8, created=0.0)
    short = gang("short", 1, 4, created=1.0, estimate_seconds=estimate)
    plan = plan_admission([head, short], nodes, used, NOW, free_at={"node-0": NOW + 100, "node-1": NOW + 100})
    assert "head" in plan.reservations and "head" in plan.waiting
    return [a.key for a in plan.admitted]


def test_a_gang_ending_before_the_head_can_start_uses_the_heads_idle_room() -> None:
    assert blocked_head_and_a_short_job(60.0) == ["short"]


def test_a_gang_that_would_end_after_the_head_could_start_waits_as_today() -> None:
    assert blocked_head_and_a_short_job(150.0) == []
    assert blocked_head_and_a_short_job(None) == []


def test_without_node_end_times_nothing_is_lent() -> None:
    nodes = [gpu_node("node-0"), gpu_node("node-1")]
    used = {"node-0": {"nvidia.com/gpu": 4}, "node-1": {"nvidia.com/gpu": 4}}
    plan = plan_admission(
        [gang("head", 2, 8), gang("short", 1, 4, created=1.0, estimate_seconds=1.0)], nodes, used, NOW
    )
    assert not plan.admitted


def test_a_head_whose_start_is_unknown_lends_nothing() -> None:
    # node-0's work has no ETA: the head may start any minute, so even a short gang must wait.
    nodes = [gpu_node("node-0"), gpu_node("node-1")]
    used = {"node-0": {"nvidia.com/gpu": 4}, "node-1": {"nvidia.com/gpu": 4}}
    head, short = gang("head", 2, 8), gang("short", 1, 4, created=1.0, estimate_seconds=1.0)
    plan = plan_admission([head, short], nodes, used, NOW, free_at={"node-0": math.inf, "node-1": NOW + 100})
    assert not plan.admitted


def test_an_eta_read_a_while_ago_counts_from_when_it_was_read() -> None:
    # From the review (issue 17): at >= 600 jobs the newest report may be 30 s old; its ETA runs
    # from the poll that read it, not from the admission pass.
    running = {"phase": "Running", "progress": {"etaSeconds": 120}}
    assert job_end(running, NOW, read_at=NOW - 30) == NOW - 30 + 120
    assert job_end(running, NOW, read_at=NOW + 5) == NOW + 120  # a clock ahead: never later than read now
