"""policy/progress_polls.py: which jobs' /progress is read now, and in what order."""

from __future__ import annotations

import pytest

from phalanx.policy.progress_polls import polls_to_start

pytestmark = pytest.mark.unit


def test_due_jobs_start_longest_overdue_first_and_a_pending_poll_is_not_repeated() -> None:
    next_poll = {"ns/late": 90.0, "ns/later": 50.0, "ns/future": 120.0, "ns/pending": 10.0}
    keys = ["ns/late", "ns/new", "ns/future", "ns/pending", "ns/later"]
    assert polls_to_start(keys, next_poll, in_flight={"ns/pending"}, now=100.0) == [
        "ns/new",
        "ns/later",
        "ns/late",
    ]


def test_nothing_due_starts_nothing() -> None:
    assert polls_to_start(["ns/a"], {"ns/a": 101.0}, in_flight=(), now=100.0) == []


# -- the pace: every job within the hang rule's staleness bound, at any number of jobs (issue 17)


@pytest.mark.parametrize("jobs", [0, 1, 20, 200, 1000, 4000, 20000])
def test_every_job_is_polled_at_least_every_half_the_hang_rules_staleness_bound(jobs: int) -> None:
    # What the slots deliver, at the ~5 ms a healthy poll takes, not only the interval aimed at.
    from phalanx.policy.hang import POLL_STALE_SECONDS
    from phalanx.policy.progress_polls import delivered_interval, poll_interval, poll_slots

    interval = poll_interval(jobs, fastest=1.0)
    slots = poll_slots(jobs, interval, 0.005)
    assert 1.0 <= delivered_interval(jobs, interval, slots, 0.005) <= POLL_STALE_SECONDS / 2


def test_a_few_jobs_are_read_each_second_and_more_jobs_share_a_bounded_rate() -> None:
    from phalanx.policy.progress_polls import POLLS_PER_SECOND, poll_interval

    assert poll_interval(5, fastest=1.0) == 1.0  # recoveries and checkpoints seen within a second
    assert 5 / poll_interval(5, fastest=1.0) <= POLLS_PER_SECOND
    assert 200 / poll_interval(200, fastest=1.0) == pytest.approx(POLLS_PER_SECOND)  # not 200 a second


@pytest.mark.parametrize("jobs", [10, 200, 1000, 4000])
@pytest.mark.parametrize("seconds_per_poll", [0.005, 0.1, 0.4, 1.8])
def test_the_slots_sized_from_the_time_a_poll_takes_keep_that_pace(
    jobs: int, seconds_per_poll: float
) -> None:
    from phalanx.policy.progress_polls import MAX_POLL_SLOTS, delivered_interval, poll_interval, poll_slots

    interval = poll_interval(jobs, fastest=1.0)
    slots = poll_slots(jobs, interval, seconds_per_poll)
    delivered = delivered_interval(jobs, interval, slots, seconds_per_poll)
    assert delivered == pytest.approx(max(interval, jobs * seconds_per_poll / min(slots, MAX_POLL_SLOTS)))
    if MAX_POLL_SLOTS / seconds_per_poll * interval >= jobs:  # the bounded slots can keep the pace
        assert delivered == interval
    else:  # they cannot: all of them, and the longer time between polls is what is reported
        assert slots == MAX_POLL_SLOTS and delivered > interval


def test_the_slots_are_bounded() -> None:
    from phalanx.policy.progress_polls import MAX_POLL_SLOTS, MIN_POLL_SLOTS, poll_slots

    assert poll_slots(1, 1.0, 0.001) == MIN_POLL_SLOTS
    assert poll_slots(100_000, 30.0, 2.0) == MAX_POLL_SLOTS  # a thread each: not without end


def test_polls_still_in_flight_count_in_the_time_a_poll_takes() -> None:
    # From the review (issue 17): the slots were sized from finished polls only; with healthy polls
    # at ~5 ms there are 8, and 8 polls waiting on silent trainers left none for the other jobs
    # while the average, fed by nothing, stayed at 5 ms.
    from phalanx.policy.progress_polls import MIN_POLL_SLOTS, poll_interval, poll_slots

    interval = poll_interval(1000, fastest=1.0)
    assert poll_slots(1000, interval, 0.005) == MIN_POLL_SLOTS
    assert poll_slots(1000, interval, 0.005, in_flight_ages=[1.9] * MIN_POLL_SLOTS) > MIN_POLL_SLOTS
    assert poll_slots(1000, interval, 0.005, in_flight_ages=[0.001] * 3) == MIN_POLL_SLOTS
