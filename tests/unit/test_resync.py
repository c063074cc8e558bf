import uuid

from phalanx.policy.resync import due_for_resync, resync_slot

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
