"""Whether a SIGTERM checkpoint fits its budget: the estimate, from a write speed and the last save.

Pure; the manager measures the speed (a short probe at start) or takes the configured one.
"""

from __future__ import annotations

from dataclasses import dataclass

# Only when the probe failed and nothing is configured: a slow network disk's figure, for the job.
FALLBACK_BYTES_PER_SECOND = 200e6
# What each rank writes and fsyncs at start to measure the storage: long enough to pass the write
# cache's first burst, short enough to cost well under a second on any disk a job should use.
PROBE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class MeasuredSave:
    """This rank's last committed save."""

    blocking_seconds: float  # staging
    write_seconds: float  # from staged to committed
    rank_bytes: int  # what this rank staged


def write_speed(configured: float, probed: float | None) -> float:
    """Bytes per second the storage takes from the whole job, all ranks writing at once."""
    if configured > 0:
        return configured
    if probed is not None and probed > 0:
        return probed
    return FALLBACK_BYTES_PER_SECOND


def emergency_estimate(*, rank_bytes: int, job_bytes: int, speed: float, last: MeasuredSave | None) -> float:
    """Seconds this rank's emergency save is expected to take.

    Without a measured save: the job's bytes at the storage speed. With one: its staging plus its
    write, both scaled to today's bytes, the write capped by the storage figure (an asynchronous save
    runs niced beside training, so it overstates what a save alone takes).
    """
    disk = job_bytes / speed
    if last is None or last.rank_bytes <= 0:
        return disk
    growth = rank_bytes / last.rank_bytes
    return last.blocking_seconds * growth + min(last.write_seconds * growth, disk)
