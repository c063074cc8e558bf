"""bench/steady_state.py: the time between two polls of a job, and the flags that say a run's poll
rate was too low for the hang rule, or behind the poller's own pace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from steady_state import poll_pace  # noqa: E402 (beside the benchmarks, not a package)

pytestmark = pytest.mark.unit


def test_a_poll_rate_that_reaches_every_job_within_the_interval_is_not_flagged() -> None:
    pace = poll_pace(jobs=200, polls_per_second=20.0, stale_seconds=60.0, pace_seconds=30.0)
    assert pace == {"seconds_between_polls_per_job": 10.0, "poll_pace_flags": []}


def test_a_run_whose_polls_come_slower_than_the_pace_or_the_hang_rule_is_flagged() -> None:
    slow = poll_pace(jobs=200, polls_per_second=4.5, stale_seconds=60.0, pace_seconds=30.0)
    assert slow["seconds_between_polls_per_job"] == 44.4
    assert len(slow["poll_pace_flags"]) == 1 and "30" in slow["poll_pace_flags"][0]
    slower = poll_pace(jobs=500, polls_per_second=4.7, stale_seconds=60.0, pace_seconds=30.0)
    assert slower["seconds_between_polls_per_job"] == 106.4
    assert len(slower["poll_pace_flags"]) == 2 and "POLL_STALE_SECONDS" in slower["poll_pace_flags"][0]


def test_the_slowest_pace_itself_is_not_flagged_for_its_noise() -> None:
    # At 600 jobs and more every job is polled each 30 s (policy/progress_polls.py).
    pace = poll_pace(jobs=2000, polls_per_second=64.0, stale_seconds=60.0, pace_seconds=30.0)
    assert pace["seconds_between_polls_per_job"] == 31.2 and pace["poll_pace_flags"] == []


def test_no_poll_answered_is_flagged_not_divided_by() -> None:
    pace = poll_pace(jobs=200, polls_per_second=0.0, stale_seconds=60.0, pace_seconds=30.0)
    assert pace["seconds_between_polls_per_job"] is None
    assert pace["poll_pace_flags"] == ["no /progress poll answered in the window"]
