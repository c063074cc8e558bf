"""The emergency-save estimate: which write speed it uses, and what a measured save adds."""

from __future__ import annotations

import pytest

from phalanx_trainer.checkpoint.budget import (
    FALLBACK_BYTES_PER_SECOND,
    PROBE_REUSE_SECONDS,
    MeasuredSave,
    emergency_estimate,
    reusable_probe,
    write_speed,
)

pytestmark = pytest.mark.unit

GB = 1e9


def test_a_configured_speed_wins_over_a_measured_one() -> None:
    assert write_speed(configured=2 * GB, probed=0.5 * GB) == 2 * GB
    assert write_speed(configured=0.0, probed=0.5 * GB) == 0.5 * GB


def test_the_fallback_is_used_only_when_nothing_was_measured_or_configured() -> None:
    assert write_speed(configured=0.0, probed=None) == FALLBACK_BYTES_PER_SECOND


def test_before_any_save_the_estimate_is_the_job_bytes_over_the_speed() -> None:
    # 8 GB for the whole job at 4 GB/s: 2 s, where the 200 MB/s assumption said 40 s.
    assert emergency_estimate(rank_bytes=1 * GB, job_bytes=8 * GB, speed=4 * GB, last=None) == pytest.approx(
        2.0
    )


def test_a_measured_save_adds_its_staging_and_caps_the_write() -> None:
    last = MeasuredSave(blocking_seconds=0.5, write_seconds=1.0, rank_bytes=1 * GB)
    assert emergency_estimate(rank_bytes=1 * GB, job_bytes=8 * GB, speed=1 * GB, last=last) == pytest.approx(
        1.5
    )
    # A niced asynchronous save that took longer than the disk figure says: the disk figure counts.
    slow = MeasuredSave(blocking_seconds=0.5, write_seconds=30.0, rank_bytes=1 * GB)
    assert emergency_estimate(rank_bytes=1 * GB, job_bytes=8 * GB, speed=1 * GB, last=slow) == pytest.approx(
        8.5
    )
    # The state grew since the measured save: staging and write scale with the bytes.
    assert emergency_estimate(
        rank_bytes=2 * GB, job_bytes=16 * GB, speed=100 * GB, last=last
    ) == pytest.approx(1.0 + 0.16)


NOW = 1_000_000.0


def test_an_earlier_probe_is_reused_for_the_same_world_size_within_the_window() -> None:
    record = {"bytes_per_second": 2 * GB, "world_size": 4, "ranks_per_node": 2, "measured": NOW - 60}
    assert reusable_probe(record, world_size=4, per_node=2, now=NOW) == 2 * GB


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (None, "no record"),
        (
            {"bytes_per_second": 2 * GB, "world_size": 8, "ranks_per_node": 2, "measured": NOW - 60},
            "other ranks wrote at once",
        ),
        (
            {"bytes_per_second": 2 * GB, "world_size": 4, "ranks_per_node": 4, "measured": NOW - 60},
            "on fewer nodes",
        ),
        (
            {
                "bytes_per_second": 2 * GB,
                "world_size": 4,
                "ranks_per_node": 2,
                "measured": NOW - PROBE_REUSE_SECONDS,
            },
            "too old",
        ),
        (
            {"bytes_per_second": 2 * GB, "world_size": 4, "ranks_per_node": 2, "measured": NOW + 60},
            "from the future",
        ),
        ({"bytes_per_second": 0, "world_size": 4, "ranks_per_node": 2, "measured": NOW}, "not a speed"),
        ({"bytes_per_second": True, "world_size": 4, "ranks_per_node": 2, "measured": NOW}, "not a number"),
        ({"bytes_per_second": "fast", "world_size": 4, "ranks_per_node": 2, "measured": NOW}, "not a number"),
        ({"bytes_per_second": 2 * GB, "measured": NOW}, "no world size"),
    ],
)
def test_a_record_that_does_not_speak_for_this_start_is_not_reused(record: object, why: str) -> None:
    assert reusable_probe(record, world_size=4, per_node=2, now=NOW) is None, why  # type: ignore[arg-type]
