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
