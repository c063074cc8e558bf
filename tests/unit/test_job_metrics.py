"""Per-job series from status changes (metrics.observe_status): what the reconciler tells
Prometheus after each decision, and what a restarted operator shows for jobs it never saw change."""

from __future__ import annotations

import pytest

from phalanx import metrics

pytestmark = pytest.mark.unit

LABELS = {"namespace": "ns-metrics", "trainingjob": "j"}


def sample(name: str, labels: dict[str, str]) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels)


@pytest.fixture(autouse=True)
def fresh_job() -> None:
    # As a process that never saw it: no series, and no memory of a deletion either.
    metrics.forget_job(LABELS["namespace"], LABELS["trainingjob"])
    metrics._JOBS.created(LABELS["namespace"], LABELS["trainingjob"])


def test_a_restarted_operator_shows_the_stored_level_of_a_job_that_did_not_change() -> None:
    # From the first review (m11): the gauges were set only when a value changed, so after an
    # operator restart a running job had no phase, straggler or goodput series until they moved.
    stored = {
        "phase": "Running",
        "stragglers": [{"pod": "j-worker-1", "ratio": 2.5}],
        "goodput": {"ratio": 0.9, "unit": "gpu", "allocatedSeconds": 100, "productiveSeconds": 90},
    }
    running_before = sample("phalanx_jobs", {"phase": "Running"}) or 0
    finished_before = sample("phalanx_jobs_finished_total", {"result": "succeeded"}) or 0
    metrics.observe_status(LABELS["namespace"], LABELS["trainingjob"], stored, dict(stored))
    assert sample("phalanx_job_straggler_ratio", LABELS) == 2.5
    assert sample("phalanx_job_goodput_ratio", LABELS) == 0.9
    assert sample("phalanx_jobs", {"phase": "Running"}) == running_before + 1
    assert (sample("phalanx_jobs_finished_total", {"result": "succeeded"}) or 0) == finished_before


def test_a_stored_finished_job_is_not_counted_as_finishing_again() -> None:
    finished_before = sample("phalanx_jobs_finished_total", {"result": "succeeded"}) or 0
    done = {"phase": "Succeeded"}
    metrics.observe_status(LABELS["namespace"], LABELS["trainingjob"], done, dict(done))
    assert (sample("phalanx_jobs_finished_total", {"result": "succeeded"}) or 0) == finished_before


def test_a_change_seen_by_this_process_is_counted_once() -> None:
    finished_before = sample("phalanx_jobs_finished_total", {"result": "succeeded"}) or 0
    metrics.observe_status(
        LABELS["namespace"], LABELS["trainingjob"], {"phase": "Running"}, {"phase": "Succeeded"}
    )
    metrics.observe_status(
        LABELS["namespace"], LABELS["trainingjob"], {"phase": "Succeeded"}, {"phase": "Succeeded"}
    )
    assert sample("phalanx_jobs_finished_total", {"result": "succeeded"}) == finished_before + 1


def test_levels_are_shown_even_when_another_series_of_the_job_came_first() -> None:
    # After a restart the admission pass may time a pending gang's wait before its first reconcile.
    metrics.observe_admission_wait_started(LABELS["namespace"], LABELS["trainingjob"], 0.0)
    metrics.observe_status(LABELS["namespace"], LABELS["trainingjob"], {"phase": "Running", "stragglers": [{"ratio": 3.0}]},
                           {"phase": "Running", "stragglers": [{"ratio": 3.0}]})  # fmt: skip
    assert sample("phalanx_job_straggler_ratio", LABELS) == 3.0


def test_a_reconcile_finishing_after_its_job_was_deleted_shows_no_ghost_series() -> None:
    # From the review: forget_job runs on the event loop while a worker may still be deciding on
    # the same job; the decision's observe_status must not bring the deleted job's levels back.
    namespace, name = LABELS["namespace"], LABELS["trainingjob"]
    running = {"phase": "Running", "stragglers": [{"ratio": 4.0}]}
    metrics.observe_status(namespace, name, running, dict(running))
    metrics.forget_job(namespace, name)
    metrics.observe_status(namespace, name, running, dict(running))
    assert sample("phalanx_job_straggler_ratio", LABELS) is None
    metrics.observe_job_created(namespace, name)  # a new job under that name is shown again
    metrics.observe_status(namespace, name, running, dict(running))
    assert sample("phalanx_job_straggler_ratio", LABELS) == 4.0


def test_every_per_job_series_goes_with_its_job_and_a_late_poll_brings_none_back() -> None:
    # The per-job series are plain values the collector turns into samples at scrape time (no
    # metric child per job): forget_job drops them all, and a poll under way at the deletion
    # (observe_progress from the poller's thread) must not bring one back.
    namespace, name = LABELS["namespace"], LABELS["trainingjob"]
    ledger = {"ratio": 0.5, "unit": "gpu", "allocatedSeconds": 100, "productiveSeconds": 50}
    metrics.observe_status(namespace, name, {}, {"phase": "Running", "currentReplicas": 2, "goodput": ledger})
    metrics.observe_status(namespace, name, {"currentReplicas": 2}, {"currentReplicas": 3})
    metrics.observe_restart(namespace, name, "preemption")
    metrics.observe_restart(namespace, name, "preemption")
    metrics.observe_progress(namespace, name, 25, 100)
    gpu = {**LABELS, "unit": "gpu"}
    assert sample("phalanx_job_progress_ratio", LABELS) == 0.25
    assert sample("phalanx_job_goodput_ratio", LABELS) == 0.5
    assert sample("phalanx_job_device_seconds", {**gpu, "kind": "productive"}) == 50
    assert sample("phalanx_job_restarts_total", {**LABELS, "reason": "preemption"}) == 2
    assert sample("phalanx_job_resizes_total", {**LABELS, "direction": "grow"}) == 1
    metrics.forget_job(namespace, name)
    metrics.observe_progress(namespace, name, 30, 100)
    every = [(s.name, s.labels) for family in metrics.REGISTRY.collect() for s in family.samples]
    assert [s for s in every if s[1].get("trainingjob") == name and s[1].get("namespace") == namespace] == []


def test_a_successor_under_a_deleted_jobs_name_shows_its_series_and_a_late_poll_of_the_old_one_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # From the review: the deletion was remembered by name only, and only a status-less first
    # reconcile (observe_job_created) cleared it. A successor first reconciled before its
    # predecessor's delete event came (kopf's worker waits a moment; our own watch does not), or
    # reconciled first by another replica before a failover, then had no series at all, for good.
    namespace, name = LABELS["namespace"], LABELS["trainingjob"]
    running = {"phase": "Running", "stragglers": [{"ratio": 2.0}]}
    metrics.observe_job_alive(namespace, name, "uid-new")
    metrics.observe_status(namespace, name, running, dict(running))
    metrics.forget_job(namespace, name, "uid-old")  # the predecessor's delete event, late
    metrics.observe_job_alive(namespace, name, "uid-old")  # a reconcile of the old one under way
    metrics.observe_status(namespace, name, running, dict(running))
    assert sample("phalanx_job_straggler_ratio", LABELS) is None  # no ghost of the old one
    metrics.observe_job_alive(namespace, name, "uid-new")  # the successor's next reconcile
    metrics.observe_status(namespace, name, running, dict(running))  # its status is not empty
    assert sample("phalanx_job_straggler_ratio", LABELS) == 2.0
    assert sample("phalanx_job_phase", {**LABELS, "phase": "Running"}) == 1.0


def test_a_deletion_is_forgotten_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    namespace, name = LABELS["namespace"], LABELS["trainingjob"]
    now = [1000.0]
    monkeypatch.setattr(metrics._JOBS, "_clock", lambda: now[0])
    metrics.forget_job(namespace, name, "uid-old")
    metrics.observe_progress(namespace, name, 1, 10)
    assert sample("phalanx_job_progress_ratio", LABELS) is None
    now[0] += metrics.DELETED_REMEMBERED_SECONDS + 1
    metrics.observe_progress(namespace, name, 1, 10)
    assert sample("phalanx_job_progress_ratio", LABELS) == 0.1


def test_a_successors_series_do_not_carry_its_predecessors_counts() -> None:
    # The name was reused while this process still held the predecessor's values (its delete event
    # had not come, or was another job's to tell): its restart count is not the successor's.
    namespace, name = LABELS["namespace"], LABELS["trainingjob"]
    metrics.observe_job_alive(namespace, name, "uid-old")
    metrics.observe_status(namespace, name, {}, {"phase": "Failed"})
    metrics.observe_restart(namespace, name, "failure")
    failed_before = sample("phalanx_jobs", {"phase": "Failed"}) or 0
    metrics.observe_job_alive(namespace, name, "uid-new")
    metrics.observe_status(namespace, name, {"phase": "Running"}, {"phase": "Running"})
    assert sample("phalanx_job_restarts_total", {**LABELS, "reason": "failure"}) is None
    assert sample("phalanx_job_phase", {**LABELS, "phase": "Running"}) == 1.0
    assert sample("phalanx_jobs", {"phase": "Failed"}) == failed_before - 1
