"""Gang timeout and requeue backoff."""

from __future__ import annotations

import pytest

from phalanx.gang.backoff import gang_timed_out, requeue_at, requeue_delay_seconds

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("timeouts", "delay"),
    [(0, 0.0), (1, 10.0), (2, 20.0), (3, 40.0), (6, 320.0), (7, 600.0), (10_000, 600.0)],
)
def test_requeue_delay_doubles_up_to_the_cap(timeouts: int, delay: float) -> None:
    assert requeue_delay_seconds(timeouts) == delay


def test_requeue_delay_honours_custom_base_and_cap() -> None:
    assert [requeue_delay_seconds(n, base=60, cap=3600) for n in range(1, 9)] == [
        60,
        120,
        240,
        480,
        960,
        1920,
        3600,
        3600,
    ]


def test_requeue_at_adds_the_delay() -> None:
    assert requeue_at(1000.0, 2) == 1020.0


@pytest.mark.parametrize(
    ("now", "running", "timed_out"),
    [
        (1059.0, 3, False),  # still inside the timeout
        (1060.0, 3, True),  # exactly at it, one pod short
        (5000.0, 4, False),  # all running: never a timeout
        (5000.0, 5, False),
    ],
)
def test_gang_timeout(now: float, running: int, timed_out: bool) -> None:
    assert (
        gang_timed_out(admitted_at=1000.0, now=now, timeout_seconds=60, pods_running=running, replicas=4)
        is timed_out
    )


def test_zero_timeout_disables_teardown() -> None:
    assert not gang_timed_out(admitted_at=0.0, now=1e9, timeout_seconds=0, pods_running=0, replicas=4)
