"""The last recovery's timeline (policy/recovery_timeline.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.policy.recovery_timeline import (
    after_reconcile,
    after_trainer_report,
    is_complete,
    iso_ms,
    parse_time,
    phase_durations,
    summary,
)

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0


def status(attempt: int, phase: str, preemptions: int = 0, failures: int = 0, **extra: Any) -> dict[str, Any]:
    conditions = [{"type": "Restarting", "status": "True" if phase == "Restarting" else "False",
                   "reason": "Preempted"}]  # fmt: skip
    return {"attempt": attempt, "phase": phase, "conditions": conditions,
            "restarts": {"failures": failures, "preemptions": preemptions}, **extra}  # fmt: skip


def restarted() -> dict[str, Any]:
    recovery = after_reconcile(status(0, "Running"), status(1, "Restarting", preemptions=1), T0)
    assert recovery is not None
    return recovery


def test_a_restart_opens_a_timeline_named_by_attempt_and_reason() -> None:
    recovery = restarted()
    assert (
        recovery["attempt"] == 1 and recovery["reason"] == "Preempted" and recovery["path"] == "FullRestart"
    )
    assert parse_time(recovery["disruptedTime"]) == pytest.approx(T0, abs=0.001)
    assert recovery["phasesMilliseconds"] == {}
    assert "stepAtDisruption" not in recovery  # no progress was reported
    with_progress = after_reconcile(
        status(0, "Running", progress={"step": 42}), status(1, "Restarting", preemptions=1), T0
    )
    assert with_progress is not None and with_progress["stepAtDisruption"] == 42


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (status(0, "Suspended"), status(1, "Pending")),  # resumed: a new attempt, no restart counted
        (status(0, "Admitted"), status(1, "Pending", gangTimeouts=1)),  # gang timeout
        (status(1, "Running", preemptions=1), status(1, "Running", preemptions=1)),  # nothing happened
    ],
)
def test_only_a_counted_restart_opens_a_timeline(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert after_reconcile(old, new, T0) is None


def test_the_operator_stamps_pods_stopped_then_running_once_each() -> None:
    recovery = restarted()
    waiting = status(1, "Restarting", preemptions=1, lastRecovery=recovery)
    assert after_reconcile(waiting, waiting, T0 + 1) is None  # old pods still stopping

    created = after_reconcile(waiting, status(1, "Pending", preemptions=1, lastRecovery=recovery), T0 + 3.25)
    assert created is not None and created["phasesMilliseconds"] == {"podsStopped": 3250}

    running = after_reconcile(waiting, status(1, "Running", preemptions=1, lastRecovery=created), T0 + 5)
    assert running is not None and running["phasesMilliseconds"] == {"podsStopped": 3250, "podsRunning": 5000}
    # Later passes change nothing: the first time each held is what counts.
    assert after_reconcile(waiting, status(1, "Running", preemptions=1, lastRecovery=running), T0 + 9) is None


def test_the_trainer_report_of_the_recovering_attempt_completes_it() -> None:
    recovery = restarted()
    report = {"attempt": 1, "resumed_from_step": 60, "startup": {
        "rendezvous_done": iso_ms(T0 + 6), "restored": iso_ms(T0 + 6.5), "first_step": iso_ms(T0 + 7.2)}}  # fmt: skip
    done = after_trainer_report(recovery, report)
    assert done is not None and is_complete(done)
    # The operator never saw the pods stopped or running (a poll came first): a step implies both.
    assert done["phasesMilliseconds"] == {
        "podsStopped": 6000, "podsRunning": 6000, "rendezvousDone": 6000, "stateRestored": 6500, "firstStep": 7200,
    }  # fmt: skip
    assert done["resumedFromStep"] == 60
    assert done["summary"].startswith("recovered in 7.2s (Preempted, attempt 1): podsStopped 6.0s")
    assert after_trainer_report(done, report) is None  # complete: frozen
    assert after_reconcile(status(1, "Running"), status(1, "Running", lastRecovery=done), T0 + 20) is None


def test_a_report_of_another_attempt_or_without_startup_times_changes_nothing() -> None:
    recovery = restarted()
    assert after_trainer_report(recovery, {"attempt": 0, "startup": {"first_step": iso_ms(T0 + 1)}}) is None
    assert after_trainer_report(recovery, {"attempt": 1}) is None
    assert after_trainer_report(None, {"attempt": 1, "startup": {"first_step": iso_ms(T0 + 1)}}) is None


def test_a_skewed_trainer_clock_never_puts_a_phase_before_the_disruption_or_the_one_before() -> None:
    recovery = restarted()
    stopped = after_reconcile(
        status(1, "Restarting", preemptions=1),
        status(1, "Running", preemptions=1, lastRecovery=recovery),
        T0 + 4,
    )
    assert stopped is not None
    # The trainer's clock runs 10 s behind: its times fall before the disruption.
    report = {"attempt": 1, "startup": {"rendezvous_done": iso_ms(T0 - 8), "first_step": iso_ms(T0 - 7)}}
    done = after_trainer_report(stopped, report)
    assert done is not None
    assert done["phasesMilliseconds"] == {
        "podsStopped": 4000, "podsRunning": 4000, "rendezvousDone": 4000, "firstStep": 4000,
    }  # fmt: skip


def test_phase_durations_are_the_time_each_phase_took() -> None:
    recovery = {"phasesMilliseconds": {"podsStopped": 3000, "podsRunning": 4500, "firstStep": 9000}}
    assert phase_durations(recovery) == {"podsStopped": 3.0, "podsRunning": 1.5, "firstStep": 4.5}
    assert summary(
        {"reason": "FailureRestart", "attempt": 2, "phasesMilliseconds": {"podsStopped": 1200}}
    ) == ("recovering (FailureRestart, attempt 2): podsStopped 1.2s")


def test_times_round_trip_with_milliseconds() -> None:
    assert parse_time(iso_ms(T0 + 0.123)) == pytest.approx(T0 + 0.123, abs=0.0005)
    assert parse_time("2026-12-01T10:00:00Z") == parse_time("2026-12-01T10:00:00.000Z")
    assert parse_time("not a time") is None and parse_time(None) is None


def test_a_recovery_torn_down_uncounted_goes_on_with_the_next_attempt() -> None:
    recovery = restarted()
    stopped = after_reconcile(status(1, "Restarting", preemptions=1),
                              status(1, "Running", preemptions=1, lastRecovery=recovery), T0 + 4)  # fmt: skip
    assert stopped is not None
    # The re-admitted gang timed out (attempt 2, no restart counted): the same recovery, attempt 2.
    moved = after_reconcile(status(1, "Running", preemptions=1),
                            status(2, "Pending", preemptions=1, lastRecovery=stopped), T0 + 60)  # fmt: skip
    assert moved is not None and moved["attempt"] == 2 and moved["disruptedTime"] == recovery["disruptedTime"]
    assert moved["phasesMilliseconds"] == {"podsStopped": 4000}
    report = {"attempt": 2, "startup": {"first_step": iso_ms(T0 + 70)}}
    done = after_trainer_report(moved, report)
    assert done is not None and is_complete(done) and done["phasesMilliseconds"]["firstStep"] == 70_000


def test_a_trainer_that_never_reports_ends_the_timeline_at_its_pods_running() -> None:
    recovery = restarted()
    running = after_reconcile(status(1, "Restarting", preemptions=1),
                              status(1, "Running", preemptions=1, lastRecovery=recovery), T0 + 5)  # fmt: skip
    assert running is not None
    still = status(1, "Running", preemptions=1, lastRecovery=running)
    assert after_reconcile(still, still, T0 + 200) is None  # still waiting for the trainer
    done = after_reconcile(still, still, T0 + 306)
    assert done is not None and is_complete(done) and done["trainerReported"] is False
    assert done["phasesMilliseconds"]["firstStep"] == 5000
    assert "no trainer report" in done["summary"]
