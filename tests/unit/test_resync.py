import uuid

from phalanx.policy.resync import (
    MAX_RESYNC_SECONDS,
    RESYNC_SECONDS,
    due_for_resync,
    resync_period,
    resync_slot,
)

SLOTS = 20


def test_every_job_comes_once_per_period_and_the_ticks_share_them_evenly() -> None:
    jobs = [(f"ns/job-{i}", str(uuid.UUID(int=i * 7919 + 1))) for i in range(4000)]
    per_tick = [due_for_resync(jobs, tick, SLOTS) for tick in range(SLOTS)]
    assert sorted(key for keys in per_tick for key in keys) == sorted(key for key, _ in jobs)
    sizes = [len(keys) for keys in per_tick]
    assert max(sizes) <= 1.25 * 4000 / SLOTS, sizes  # no tick takes the whole cluster
    assert min(sizes) >= 0.75 * 4000 / SLOTS, sizes


def test_a_jobs_slot_is_stable() -> None:
    uid = "0b5c3a5e-2f6e-4a9c-9f0e-1d2c3b4a5f60"
    assert resync_slot(uid, SLOTS) == resync_slot(uid, SLOTS) == resync_slot(str(uid), SLOTS)
    assert due_for_resync([("ns/a", uid)], resync_slot(uid, SLOTS) + SLOTS, SLOTS) == ["ns/a"]


def test_the_period_is_20_s_up_to_500_jobs_then_grows_to_keep_about_25_reconciles_a_second() -> None:
    assert [resync_period(n) for n in (0, 1, 500)] == [RESYNC_SECONDS] * 3
    assert resync_period(501) == 40.0
    assert resync_period(1000) == 40.0
    assert resync_period(2000) == 80.0
    for jobs in range(501, 3001, 7):
        period = resync_period(jobs)
        assert jobs / period <= 25.0 and period % RESYNC_SECONDS == 0, jobs
    # Beyond 3,000 jobs the cap holds: every job still comes within two minutes.
    assert resync_period(4000) == resync_period(100_000) == MAX_RESYNC_SECONDS == 120.0


def test_a_count_hovering_at_a_step_keeps_the_longer_period_until_it_is_a_tenth_below() -> None:
    assert resync_period(1000) == 40.0 and resync_period(1001) == 60.0
    assert resync_period(999, current=60.0) == 60.0  # just below the step: kept
    assert resync_period(901, current=60.0) == 60.0
    assert resync_period(899, current=60.0) == 40.0  # a tenth below: shorter again
    assert resync_period(1501, current=60.0) == 80.0  # growing is never held back
    assert resync_period(10, current=120.0) == RESYNC_SECONDS
