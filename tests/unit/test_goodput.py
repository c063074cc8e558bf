"""Goodput and device time per job (policy/goodput.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.policy.goodput import REFRESH_SECONDS, Devices, TrainerFacts, account, ratio
from phalanx.policy.recovery_timeline import iso_ms

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
GPUS = Devices("nvidia.com/gpu", 8)


def st(phase: str, attempt: int = 0, **extra: Any) -> dict[str, Any]:
    return {"phase": phase, "attempt": attempt, "restarts": {"failures": 0, "preemptions": 0}, **extra}


class Job:
    """Feeds account() a sequence of statuses, as the reconcile does."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}

    def to(self, new: dict[str, Any], at: float, trainer: TrainerFacts | None = None) -> dict[str, Any]:
        ledger = account(self.status, new, T0, T0 + at, GPUS, trainer)
        self.status = {**new, "goodput": ledger if ledger is not None else self.status.get("goodput")}
        return self.status["goodput"]  # type: ignore[no-any-return]


def test_waiting_then_start_up_then_training_are_booked_to_their_causes() -> None:
    job = Job()
    job.to(st("Pending"), 0)
    job.to(st("Admitted"), 10)  # waited 10 s for admission
    job.to(st("Running", startTime="x"), 12)  # 2 s of containers starting
    # The trainer's first step came 3 s into Running: those 3 s are start-up, the rest training.
    ledger = job.to(st("Succeeded", startTime="x"), 42, TrainerFacts(0, first_step_at=T0 + 15))
    assert ledger["waitingForAdmissionSeconds"] == 10 * 8
    assert ledger["startupSeconds"] == (2 + 3) * 8
    assert ledger["productiveSeconds"] == 27 * 8
    assert ledger["allocatedSeconds"] == 32 * 8  # from admission on
    assert ratio(ledger) == pytest.approx(27 / 42, abs=0.001)
    assert ledger["unit"] == "nvidia.com/gpu" and ledger["devices"] == "8"


def test_a_finished_job_keeps_the_ratio_it_achieved() -> None:
    job = Job()
    job.to(st("Running", startTime="x"), 0)
    done = job.to(st("Succeeded", startTime="x"), 100)
    assert account(job.status, job.status, T0, T0 + 10_000, GPUS) is None
    assert ratio(done) == 1.0


def test_nothing_is_written_between_phase_changes_more_often_than_the_refresh() -> None:
    job = Job()
    job.to(st("Running", startTime="x"), 0)
    assert account(job.status, job.status, T0, T0 + REFRESH_SECONDS - 1, GPUS) is None
    assert account(job.status, job.status, T0, T0 + REFRESH_SECONDS, GPUS) is not None


def test_a_write_that_happens_anyway_books_a_holding_job_and_the_refresh_counts_from_it() -> None:
    # The progress sample's write carries the booking (policy/progress_writes.py): one write, not two.
    job = Job()
    job.to(st("Running", startTime="x"), 0)
    ledger = account(job.status, job.status, T0, T0 + 12, GPUS, written_anyway=True)
    assert ledger is not None and ledger["productiveSeconds"] == 12 * 8
    job.status = {**job.status, "goodput": ledger}
    assert account(job.status, job.status, T0, T0 + 12 + REFRESH_SECONDS - 1, GPUS) is None
    queued = {"phase": "Pending", "goodput": ledger}  # not holding: its next phase change books it
    assert account(queued, queued, T0, T0 + 20, GPUS, written_anyway=True) is None


def test_a_restart_books_the_recovery_until_its_first_step_and_the_redone_steps() -> None:
    job = Job()
    job.to(st("Running", startTime="x"), 0)
    # At 100 s: disrupted at step 130 (as last reported); 0.5 s per step.
    recovery = {"attempt": 1, "reason": "Preempted", "disruptedTime": iso_ms(T0 + 100), "phasesMilliseconds": {},
                "stepAtDisruption": 130}  # fmt: skip
    restarts = {"failures": 0, "preemptions": 1}
    ledger = job.to(st("Restarting", 1, startTime="x", restarts=restarts, lastRecovery=recovery), 100)
    assert ledger["productiveSeconds"] == 100 * 8 and ledger["redoneStepsSeconds"] == 0
    stopped = {**recovery, "phasesMilliseconds": {"podsStopped": 2000}}
    job.to(st("Running", 1, startTime="x", restarts=restarts, lastRecovery=stopped), 104)
    # Back to training 9 s after the disruption, resumed from the checkpoint at step 100; booked at 120 s.
    complete = {**recovery, "resumedFromStep": 100,
                "phasesMilliseconds": {"podsStopped": 2000, "podsRunning": 4000, "firstStep": 9000}}  # fmt: skip
    facts = TrainerFacts(1, first_step_at=T0 + 109, seconds_per_step=0.5)
    ledger = job.to(st("Running", 1, startTime="x", restarts=restarts, lastRecovery=complete), 120, facts)
    assert ledger["recoverySeconds"] == 9 * 8
    assert ledger["redoneStepsSeconds"] == 30 * 0.5 * 8  # steps 101-130 trained twice
    assert ledger["productiveSeconds"] == (100 + 11 - 15) * 8
    assert ledger["allocatedSeconds"] == 120 * 8


def test_a_recovery_that_resumed_where_it_stopped_redoes_nothing() -> None:
    job = Job()
    job.to(st("Running", startTime="x"), 0)
    recovery = {
        "attempt": 1,
        "disruptedTime": iso_ms(T0 + 50),
        "phasesMilliseconds": {},
        "stepAtDisruption": 58,
    }
    restarts = {"failures": 0, "preemptions": 1}
    job.to(st("Restarting", 1, startTime="x", restarts=restarts, lastRecovery=recovery), 50)
    # The SIGTERM checkpoint was at step 60, past the last step the operator had seen reported.
    complete = {**recovery, "resumedFromStep": 60, "phasesMilliseconds": {"firstStep": 5000}}
    facts = TrainerFacts(1, first_step_at=T0 + 55, seconds_per_step=0.5)
    ledger = job.to(st("Running", 1, startTime="x", restarts=restarts, lastRecovery=complete), 60, facts)
    assert ledger["redoneStepsSeconds"] == 0 and ledger["recoverySeconds"] == 5 * 8


def test_checkpoint_stalls_are_booked_once_per_report_and_per_attempt() -> None:
    job = Job()
    job.to(st("Running", startTime="x"), 0)
    first = job.to(
        st("Running", startTime="x"), 40, TrainerFacts(0, first_step_at=T0, checkpoint_stall_seconds=2.0)
    )
    assert first["checkpointStallsSeconds"] == 2 * 8 and first["productiveSeconds"] == 38 * 8
    # The same report again books nothing more; a larger one books the difference.
    same = job.to(
        st("Running", startTime="x"), 80, TrainerFacts(0, first_step_at=T0, checkpoint_stall_seconds=2.0)
    )
    assert same["checkpointStallsSeconds"] == 2 * 8
    more = job.to(
        st("Running", startTime="x"), 120, TrainerFacts(0, first_step_at=T0, checkpoint_stall_seconds=3.5)
    )
    assert more["checkpointStallsSeconds"] == 28  # 3.5 s x 8
    # A report of another attempt is not this attempt's.
    assert (
        account(job.status, job.status, T0, T0 + 121, GPUS, TrainerFacts(1, checkpoint_stall_seconds=9.0))
        is None
    )


def test_cpu_only_gangs_count_cores_and_say_so() -> None:
    cores = Devices("cpu", 2.5)
    ledger = account({}, st("Running", startTime="x"), T0, T0 + 1, cores)
    assert ledger is not None and ledger["unit"] == "cpu" and ledger["devices"] == "2.5"


def test_training_that_starts_before_the_status_says_running_is_productive() -> None:
    # The status still says Admitted when the trainer's first step comes, 4 s into a 10 s span.
    job = Job()
    job.to(st("Pending"), 0)
    job.to(st("Admitted"), 10)
    ledger = job.to(st("Running", startTime="x"), 20, TrainerFacts(0, first_step_at=T0 + 14))
    assert ledger["waitingForAdmissionSeconds"] == 10 * 8
    assert ledger["startupSeconds"] == 4 * 8 and ledger["productiveSeconds"] == 6 * 8


def test_every_second_goes_to_one_cause_through_a_restart() -> None:
    job = Job()
    restarts = {"failures": 1, "preemptions": 0}
    recovery = {"attempt": 1, "disruptedTime": iso_ms(T0 + 30), "phasesMilliseconds": {}}
    done = {**recovery, "phasesMilliseconds": {"firstStep": 12_000}}
    facts0 = TrainerFacts(0, first_step_at=T0 + 8)
    facts1 = TrainerFacts(1, first_step_at=T0 + 42)
    job.to(st("Pending"), 0)
    job.to(st("Admitted"), 3)
    job.to(st("Running", startTime="x"), 5, facts0)
    job.to(st("Restarting", 1, startTime="x", restarts=restarts, lastRecovery=recovery), 30, facts0)
    job.to(st("Pending", 1, startTime="x", restarts=restarts, lastRecovery=recovery), 33)
    job.to(st("Admitted", 1, startTime="x", restarts=restarts, lastRecovery=recovery), 35)
    job.to(st("Running", 1, startTime="x", restarts=restarts, lastRecovery=done), 45, facts1)
    ledger = job.to(st("Succeeded", 1, startTime="x", restarts=restarts, lastRecovery=done), 80, facts1)
    causes = ("productive", "waitingForAdmission", "startup", "recovery", "redoneSteps", "checkpointStalls")
    assert sum(ledger[f"{cause}Seconds"] for cause in causes) == 80 * 8
    assert ledger["recoverySeconds"] == 12 * 8 and ledger["startupSeconds"] == 5 * 8


def test_a_stall_report_is_booked_once_even_when_its_value_does_not_round_evenly() -> None:
    # Review finding: the booked value was stored rounded, so 1.2344 s left 0.0004 s "unbooked" on
    # every pass, and every pass wrote the status again.
    job = Job()
    job.to(st("Running", startTime="x"), 0)
    facts = TrainerFacts(0, first_step_at=T0, checkpoint_stall_seconds=1.2344)
    job.to(st("Running", startTime="x"), 40, facts)
    assert account(job.status, job.status, T0, T0 + 41, GPUS, facts) is None


def test_a_queued_or_suspended_job_is_booked_at_its_next_phase_change_only() -> None:
    for phase in ("Pending", "Suspended"):
        job = Job()
        job.to(st(phase), 0)
        assert account(job.status, job.status, T0, T0 + 10 * REFRESH_SECONDS, GPUS) is None


def test_the_first_attempt_waits_for_its_trainers_first_report_before_booking() -> None:
    job = Job()
    started = iso_ms(T0 + 15)
    job.to(st("Pending"), 0)
    job.to(st("Admitted"), 10)
    job.to(st("Running", startTime=started), 15)
    # 35 s in, no report yet: nothing booked (it may all be start-up).
    assert account(job.status, job.status, T0, T0 + 50, GPUS) is None
    ledger = job.to(st("Running", startTime=started), 95, TrainerFacts(0, first_step_at=T0 + 95))
    assert ledger["startupSeconds"] == (5 + 80) * 8 and ledger["productiveSeconds"] == 0
    # A trainer that never reports: after the grace, its running time is booked as productive.
    silent = Job()
    silent.to(st("Running", startTime=iso_ms(T0)), 0)
    late = account(silent.status, silent.status, T0, T0 + 301, GPUS)
    assert late is not None and late["productiveSeconds"] == 301 * 8


def test_redone_steps_are_booked_at_the_disrupted_attempts_pace_when_the_new_one_has_none_yet() -> None:
    # At its first step the recovering attempt reports no step time: the last one known counts.
    job = Job()
    job.to(st("Running", startTime="x"), 0)
    job.to(st("Running", startTime="x"), 40, TrainerFacts(0, first_step_at=T0, seconds_per_step=0.5))
    recovery = {
        "attempt": 1,
        "disruptedTime": iso_ms(T0 + 50),
        "phasesMilliseconds": {},
        "stepAtDisruption": 90,
    }
    restarts = {"failures": 1, "preemptions": 0}
    job.to(st("Restarting", 1, startTime="x", restarts=restarts, lastRecovery=recovery), 50)
    complete = {**recovery, "resumedFromStep": 80, "phasesMilliseconds": {"firstStep": 5000}}
    ledger = job.to(st("Running", 1, startTime="x", restarts=restarts, lastRecovery=complete), 56,
                    TrainerFacts(1, first_step_at=T0 + 55))  # fmt: skip
    assert ledger["redoneStepsSeconds"] == 10 * 0.5 * 8


ONE_CORE = Devices("cpu", 1)


def exact_seconds(ledger: dict[str, Any], cause: str) -> float:
    """The whole device-seconds shown plus the fraction the ledger carries to the next booking."""
    return float(ledger[f"{cause}Seconds"]) + ledger.get("remainderMilliseconds", {}).get(cause, 0) / 1000


def test_sub_second_stalls_add_up_instead_of_rounding_away() -> None:
    # A save that stalls the loop 0.3 s at every booking: rounded per booking, 0 s would be booked.
    status: dict[str, Any] = {"phase": "Running", "startTime": "x", "attempt": 0}
    for n in range(1, 11):
        new = st("Running", startTime="x")
        facts = TrainerFacts(0, first_step_at=T0, checkpoint_stall_seconds=round(0.3 * n, 6))
        ledger = account(status, new, T0, T0 + 40 * n, ONE_CORE, facts)
        assert ledger is not None
        status = {**new, "goodput": ledger}
    assert exact_seconds(status["goodput"], "checkpointStalls") == pytest.approx(3.0, abs=0.002)
    assert status["goodput"]["checkpointStallsSeconds"] == 3  # whole seconds shown, the rest carried
    causes = ("productive", "waitingForAdmission", "startup", "recovery", "redoneSteps", "checkpointStalls")
    total = sum(exact_seconds(status["goodput"], cause) for cause in causes)
    assert total == pytest.approx(400.0, abs=0.002)  # nothing lost to rounding over ten bookings


def test_redone_steps_shorter_than_a_device_second_are_still_booked() -> None:
    status: dict[str, Any] = {}
    for new, at, facts in (
        (st("Running", startTime="x"), 0.0, None),
        (st("Running", startTime="x"), 40.0, TrainerFacts(0, first_step_at=T0, seconds_per_step=0.04)),
    ):
        status = {**new, "goodput": account(status, new, T0, T0 + at, ONE_CORE, facts)}
    recovery = {
        "attempt": 1,
        "disruptedTime": iso_ms(T0 + 50),
        "phasesMilliseconds": {},
        "stepAtDisruption": 28,
    }
    restarts = {"failures": 1, "preemptions": 0}
    new = st("Restarting", 1, startTime="x", restarts=restarts, lastRecovery=recovery)
    status = {**new, "goodput": account(status, new, T0, T0 + 50, ONE_CORE)}
    complete = {**recovery, "resumedFromStep": 20, "phasesMilliseconds": {"firstStep": 5000}}
    new = st("Running", 1, startTime="x", restarts=restarts, lastRecovery=complete)
    ledger = account(status, new, T0, T0 + 56, ONE_CORE, TrainerFacts(1, first_step_at=T0 + 55))
    assert ledger is not None
    assert exact_seconds(ledger, "redoneSteps") == pytest.approx(8 * 0.04, abs=0.002)


def test_a_clock_behind_the_last_booking_never_moves_accounted_time_back() -> None:
    # From the review (issue 17): a replica whose clock is S behind booked with the span clamped to
    # 0 and accountedTime S earlier, and the failback to a correct clock counted those S twice.
    job = Job()
    job.to(st("Running", startTime="x"), 0, TrainerFacts(0, first_step_at=T0))
    job.to(st("Running", startTime="x"), 40, TrainerFacts(0, first_step_at=T0))
    booked = job.status["goodput"]
    behind = account(job.status, st("Running", startTime="x"), T0, T0 + 30, GPUS,
                     TrainerFacts(0, first_step_at=T0), written_anyway=True)  # fmt: skip
    assert behind is None or behind["accountedTime"] == booked["accountedTime"]
    # A phase change is booked even then, with no time going back or counted twice.
    done = account(job.status, st("Succeeded", startTime="x"), T0, T0 + 30, GPUS,
                   TrainerFacts(0, first_step_at=T0))  # fmt: skip
    assert done is not None and done["accountedTime"] == booked["accountedTime"]
    assert done["allocatedSeconds"] == booked["allocatedSeconds"]


def test_warm_spares_standing_by_are_allocated_never_productive_and_lower_the_ratio() -> None:
    # 8 workers' GPUs train; 2 spares' GPUs stand by: the job holds 10, 8 of them train.
    with_spares = Devices("nvidia.com/gpu", 8, spares=2)
    first = account({}, st("Running", startTime="x"), T0, T0, with_spares)
    assert first is not None
    ledger = account({**st("Running", startTime="x"), "goodput": first}, st("Running", startTime="x"), T0,
                     T0 + 100, with_spares, written_anyway=True)  # fmt: skip
    assert ledger is not None
    assert ledger["productiveSeconds"] == 100 * 8
    assert ledger["standbySparesSeconds"] == 100 * 2
    assert ledger["allocatedSeconds"] == 100 * 10
    assert ratio(ledger) == pytest.approx(0.8, abs=0.001), "spares cost devices: 800 of 1,000 trained"
    assert ledger["devices"] == "8", "the gang's devices; the spares' are counted apart"


def test_spares_of_a_job_that_holds_nothing_are_not_booked() -> None:
    # 50 s Pending, booked when it is admitted: waiting, with no spare standby (none can stand by).
    with_spares = Devices("nvidia.com/gpu", 8, spares=2)
    ledger = account({**st("Pending"), "goodput": {"accountedTime": iso_ms(T0)}}, st("Admitted"), T0, T0 + 50,
                     with_spares)  # fmt: skip
    assert ledger is not None
    assert ledger["waitingForAdmissionSeconds"] == 50 * 8
    assert ledger["standbySparesSeconds"] == 0 and ledger["allocatedSeconds"] == 0
