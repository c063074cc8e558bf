"""Which jobs' /progress the poller starts reading now (used by controller/progress.py).

The polls run concurrently, PROGRESS_CONCURRENCY at most, with no barrier between batches: a poll
that waits its full timeout on a silent pod holds one slot, not the seven polls queued behind it.
A job whose last poll has not answered yet is not asked again (its state is one poll's to change).
Every poll sets its job's next one (an answer: a poll interval after it began; silence: the back-off),
so the order below is by how long each job has been due."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping


def polls_to_start(keys: Iterable[str], next_poll: Mapping[str, float], in_flight: Collection[str],
                   now: float) -> list[str]:  # fmt: skip
    """The due jobs not being polled, the longest overdue first (never polled counts as most)."""
    due = [k for k in keys if k not in in_flight and next_poll.get(k, float("-inf")) <= now]
    return sorted(due, key=lambda k: next_poll.get(k, float("-inf")))
