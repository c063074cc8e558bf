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

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        assert trainer_answers("127.0.0.1", server.server_address[1])
    finally:
        thread.join(5)
        server.server_close()
    assert not trainer_answers("127.0.0.1", free_port())
