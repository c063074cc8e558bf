"""Whether a SIGTERM checkpoint fits its budget: the estimate, from a write speed and the last save.

Pure; the manager measures the speed (a short probe at start) or takes the configured one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Only when the probe failed and nothing is configured: a slow network disk's figure, for the job.
FALLBACK_BYTES_PER_SECOND = 200e6
# What each rank writes and fsyncs at start to measure the storage: long enough to pass the write
# cache's first burst, short enough to cost well under a second on any disk a job should use.
PROBE_BYTES = 32 * 1024 * 1024
# A probe's figure serves the job's later starts (a restart in place, a full restart) for this long:
# every generation paid the probe again (a quarter of a restore on a small model) for the same disk.
PROBE_REUSE_SECONDS = 3600.0


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


def reusable_probe(
    record: Mapping[str, Any] | None, *, world_size: int, per_node: int, now: float
) -> float | None:
    """An earlier start's probe figure, if it still speaks for this start: as many ranks writing at
    once, as many to a node (the figure is the whole job's, through its nodes' links), measured less
    than PROBE_REUSE_SECONDS ago and not later than now (a clock that jumped back says nothing)."""
    if not isinstance(record, Mapping):
        return None
    speed, ranks, measured = record.get("bytes_per_second"), record.get("world_size"), record.get("measured")
    if not isinstance(speed, int | float) or isinstance(speed, bool) or speed <= 0:
        return None
    if not isinstance(ranks, int) or ranks != world_size or record.get("ranks_per_node") != per_node:
        return None
    if not isinstance(measured, int | float) or not 0 <= now - measured < PROBE_REUSE_SECONDS:
        return None
    return float(speed)


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
