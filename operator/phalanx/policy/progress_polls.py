"""Which jobs' /progress the poller starts reading now, and how often (used by controller/progress.py).

The pace: each job every second while the jobs are few; past POLLS_PER_SECOND jobs, a bounded rate
shared among them (a poll costs the operator CPU, and nothing needs each step), but never less than
once per half of the hang rule's staleness bound (policy/hang.py POLL_STALE_SECONDS), so its
verdicts rest on fresh looks at any number of jobs. The polls run concurrently with no barrier
between batches: a poll that waits its full timeout on a silent pod holds one slot, not the polls
queued behind it. The slots are sized from the pace and the time a poll takes (Little's law), within
bounds. A job whose last poll has not answered yet is not asked again (its state is one poll's to
change). Every poll sets its job's next one (an answer: a poll interval after it began; silence: the
back-off), so the order below is by how long each job has been due."""

from __future__ import annotations

import math
import zlib
from collections.abc import Collection, Iterable, Mapping
from typing import Final

from phalanx.policy.hang import POLL_STALE_SECONDS

POLLS_PER_SECOND: Final = 20.0  # the rate aimed at once there are more jobs than this
SLOWEST_POLL_SECONDS: Final = POLL_STALE_SECONDS / 2
MIN_POLL_SLOTS: Final = 8
MAX_POLL_SLOTS: Final = 64  # a thread each, mostly waiting on a socket
SLOT_HEADROOM: Final = 2.0  # for polls slower than the average, and the ticks between starts
# A trainer that does not answer: asked at the pace for this long (imports, rendezvous, an image
# pull), then less and less often, up to BACKOFF_INTERVALS poll intervals (never under
# MAX_BACKOFF_SECONDS, never over the hang rule's POLL_STALE_SECONDS): at scale a dead endpoint
# costs less than a live one (half as much past 600 jobs).
PATIENT_SECONDS: Final = 300.0
MAX_BACKOFF_SECONDS: Final = 30.0
BACKOFF_INTERVALS: Final = 4.0


def poll_interval(jobs: int, fastest: float) -> float:
    """Seconds between two polls of one job, when `jobs` are polled."""
    return min(SLOWEST_POLL_SECONDS, max(fastest, jobs / POLLS_PER_SECOND))


def poll_slots(
    jobs: int, interval: float, seconds_per_poll: float, in_flight_ages: Collection[float] = ()
) -> int:
    """Polls in flight at once: the rate the pace needs times how long a poll takes, with headroom.
    `seconds_per_poll` averages finished polls; the polls still waiting (their ages so far) count
    too, or polls stuck on silent trainers would leave no slot while the average stays low."""
    if in_flight_ages:
        seconds_per_poll = max(seconds_per_poll, sum(in_flight_ages) / len(in_flight_ages))
    needed = math.ceil(SLOT_HEADROOM * jobs / interval * seconds_per_poll)
    return max(MIN_POLL_SLOTS, min(MAX_POLL_SLOTS, needed))


def delivered_interval(jobs: int, interval: float, slots: int, seconds_per_poll: float) -> float:
    """Seconds between two polls of a job that `slots` polls in flight can deliver: the interval
    aimed at, or longer when they cannot answer jobs / interval polls a second (MAX_POLL_SLOTS
    reached with slow polls)."""
    return max(interval, jobs * seconds_per_poll / max(1, min(slots, MAX_POLL_SLOTS)))


def first_poll_offset(uid: str, interval: float) -> float:
    """Seconds until a newly tracked job's first poll: a share of one interval taken from its uid,
    so jobs tracked together (an operator restart, a failover) are polled spread out, not in a
    burst at every interval after."""
    return interval * (zlib.crc32(uid.encode()) / 2**32)


def failed_poll_delay(failures: int, interval: float) -> float:
    """Seconds until the next poll of a trainer whose last `failures` polls went unanswered."""
    slow = max(0, failures - math.ceil(PATIENT_SECONDS / interval))
    # Never past the hang rule's staleness bound: a wedged rank 0 answers nothing, and a verdict on
    # it needs polls no older than that (policy/hang.py).
    longest = min(POLL_STALE_SECONDS, max(MAX_BACKOFF_SECONDS, BACKOFF_INTERVALS * interval))
    return max(interval, min(longest, interval * 2.0 ** min(slow, 32)))


def polls_to_start(keys: Iterable[str], next_poll: Mapping[str, float], in_flight: Collection[str],
                   now: float) -> list[str]:  # fmt: skip
    """The due jobs not being polled, the longest overdue first (never polled counts as most)."""
    due = [k for k in keys if k not in in_flight and next_poll.get(k, float("-inf")) <= now]
    return sorted(due, key=lambda k: next_poll.get(k, float("-inf")))
