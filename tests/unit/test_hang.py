"""When a running gang counts as hung (policy/hang.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.policy.hang import (
    FLOOR_SECONDS,
    STEP_MULTIPLE,
    detect,
    hang_bound,
    probe_due,
)

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0


def report(**extra: Any) -> dict[str, Any]:
    base = {"attempt": 1, "step": 40, "step_seen_at": T0, "total_steps": 100, "seconds_per_step": 0.5,
            "startup": {"first_step": "2027-01-15T08:00:00.000Z"}}  # fmt: skip
    return {**base, **extra}


def test_the_bound_is_the_spec_else_a_multiple_of_the_step_time_never_below_the_floor() -> None:
    assert hang_bound(45, 0.5).seconds == 45 and "hangTimeoutSeconds" in hang_bound(45, 0.5).source
    assert hang_bound(None, 0.5).seconds == FLOOR_SECONDS  # 20 x 0.5 s is under the floor
    slow = hang_bound(None, 60.0)
    assert slow.seconds == 60.0 * STEP_MULTIPLE and "step time" in slow.source
    assert hang_bound(None, None).seconds == FLOOR_SECONDS


def test_a_gang_whose_step_stalls_past_the_bound_is_hung_and_the_message_names_the_silent_pods() -> None:
    hang, recheck = detect(report(silent_pods=["job-worker-1"]), 1, T0 + 46, 45)
    assert hang is not None and recheck is None
    text = hang.message()
    assert "no training step for 46s since step 40" in text and "job-worker-1" in text
    assert "bound 45s" in text


def test_before_the_bound_it_is_not_hung_and_says_when_to_look_again() -> None:
    hang, recheck = detect(report(), 1, T0 + 30, 45)
    assert hang is None and recheck == pytest.approx(15)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"attempt": 0}, "the report is of an earlier attempt"),
        ({"startup": {}}, "no step of this attempt yet: start-up or restore"),
        ({"step": 100}, "the last step is done: the final save and exit are no hang"),
        ({"step_seen_at": None}, "the poller has not timed a step"),
    ],
)
def test_nothing_counts_as_a_hang_outside_training_steps(changes: dict[str, Any], why: str) -> None:
    hang, recheck = detect(report(**changes), 1, T0 + 10_000, 45)
    assert hang is None and recheck is None, why


def test_with_no_silent_pod_the_message_says_every_pod_answers() -> None:
    hang, _ = detect(report(), 1, T0 + 400, None)
    assert hang is not None and "every pod still answers" in hang.message() and "300s floor" in hang.message()


def test_pods_are_probed_from_half_the_bound() -> None:
    assert not probe_due(report(), 1, T0 + 22, 45)
    assert probe_due(report(), 1, T0 + 23, 45)
    assert not probe_due(report(attempt=0), 1, T0 + 100, 45)


def test_the_poller_times_a_step_from_when_it_first_saw_it() -> None:
    from phalanx.controller.progress import with_step_timing

    first = with_step_timing({"attempt": 1, "step": 40}, None, T0)
    same = with_step_timing({"attempt": 1, "step": 40}, {**first, "silent_pods": ["p"]}, T0 + 9)
    assert same["step_seen_at"] == T0 and same["silent_pods"] == ["p"]  # a stall keeps its start and probe
    moved = with_step_timing({"attempt": 1, "step": 41}, same, T0 + 10)
    assert moved["step_seen_at"] == T0 + 10 and "silent_pods" not in moved  # a new step starts afresh
    restarted = with_step_timing({"attempt": 2, "step": 41}, moved, T0 + 11)
    assert restarted["step_seen_at"] == T0 + 11


def test_a_pod_that_answers_404_answers_and_a_closed_port_does_not() -> None:
    # Only global rank 0 serves /progress: the other pods' metrics servers answer 404, and are alive.
    import http.server
    import threading

    from phalanx.controller.progress import trainer_answers
    from phalanx.ports import free_port

    class NotServingProgress(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_error(404)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotServingProgress)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        assert trainer_answers("127.0.0.1", server.server_address[1])
    finally:
        thread.join(5)
        server.server_close()
    assert not trainer_answers("127.0.0.1", free_port())


def test_a_gang_that_logs_rarely_is_timed_by_its_last_step_not_its_logged_one() -> None:
    from phalanx.controller.progress import with_step_timing

    # Logged every 100 steps (step stays at 100), but last_step moves at each poll: no stall.
    first = with_step_timing({"attempt": 1, "step": 100, "last_step": 150}, None, T0)
    later = with_step_timing({"attempt": 1, "step": 100, "last_step": 160}, first, T0 + 400)
    assert later["step_seen_at"] == T0 + 400
    stalled = {**report(step=100, total_steps=1000), "last_step": 160, "step_seen_at": T0}
    hang, _ = detect(stalled, 1, T0 + 400, None)
    assert hang is not None and hang.step == 160


def test_no_verdict_while_the_operators_own_poller_has_not_looked_lately() -> None:
    hang, recheck = detect(report(polled_at=T0 + 100), 1, T0 + 400, 45)
    assert hang is None and recheck is not None
    hang, _ = detect(report(polled_at=T0 + 390), 1, T0 + 400, 45)
    assert hang is not None


def test_a_healthy_gang_polled_less_often_than_its_bound_is_not_judged_hung() -> None:
    # From the review (issue 17): at thousands of jobs a job is polled every ~30 s. Its step moved
    # at every poll, but between two polls now - step_seen_at passes a 10 s bound; only a poll that
    # found the same step past the bound is evidence of a stall.
    polled = report(step_seen_at=T0, polled_at=T0)  # the poll at T0 found a new step
    hang, recheck = detect(polled, 1, T0 + 25, 10)
    assert hang is None and recheck is not None
    # The next poll (T0 + 30) finds the same step still: a stall of at least 30 s, past the bound.
    hang, _ = detect(report(step_seen_at=T0, polled_at=T0 + 30, silent_pods=[]), 1, T0 + 31, 10)
    assert hang is not None


def test_at_the_30_s_pace_the_verdict_waits_for_the_probe_and_names_the_silent_pod() -> None:
    # From the review (issue 17): polled every 30 s against a 10 s bound, the poll at T0 + 30 is the
    # first to find the stall, so the probe starts there (it takes >= 2 s) while that poll already
    # meets the verdict's condition; the recheck 1 s later must not say "every pod still answers".
    from phalanx.policy.hang import probe_wait_seconds

    stalled = report(step_seen_at=T0, polled_at=T0 + 30)
    hang, recheck = detect(stalled, 1, T0 + 31, 10, pods=2)
    assert hang is None and recheck is not None and recheck > 0
    hang, _ = detect({**stalled, "silent_pods": ["job-worker-1"]}, 1, T0 + 33, 10, pods=2)
    assert hang is not None and hang.silent_pods == ("job-worker-1",)
    assert "not answering: job-worker-1" in hang.message()
    # A probe that never reports (lost, or queued behind others') holds the verdict a bounded while.
    wait = probe_wait_seconds(2)
    assert 2 * 2.0 < wait <= 60
    hang, _ = detect(stalled, 1, T0 + 30 + wait + 0.1, 10, pods=2)
    assert hang is not None and hang.silent_pods == ()


def test_a_healthy_gang_polled_less_often_than_its_bound_is_looked_at_again_after_its_next_poll() -> None:
    # From the review (issue 17): a 10 s bound and a poll every 30 s had a healthy job reconciled
    # every 5 s between its polls, for nothing: only the next poll can say more.
    polled = report(step_seen_at=T0, polled_at=T0, next_poll_after=30.0)
    hang, recheck = detect(polled, 1, T0 + 11, 10)
    assert hang is None and recheck is not None and recheck >= 30 - 11


def test_a_probe_that_never_reports_holds_the_verdict_a_bounded_while_even_at_the_1_s_pace() -> None:
    # From the second review: the wait for the probe was counted from the latest poll, so at one
    # poll a second it moved on with every poll and a lost probe held the verdict as long as polls
    # came. Counted from when the stall passed its bound, plus one poll interval, it ends.
    from phalanx.policy.hang import probe_wait_seconds

    deadline = T0 + 10 + 1.0 + probe_wait_seconds(2)
    late = deadline + 0.1
    hang, _ = detect(report(step_seen_at=T0, polled_at=late - 0.5, next_poll_after=1.0), 1, late, 10, pods=2)
    assert hang is not None and hang.silent_pods == ()
