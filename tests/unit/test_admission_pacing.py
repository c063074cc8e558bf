"""The pause after an admission pass: sized by what the pass cost, within bounds."""

from __future__ import annotations

import pytest

from phalanx.policy.admission_pacing import MAX_DUTY, MAX_PAUSE_SECONDS, MIN_PAUSE_SECONDS, pause_after


def test_a_cheap_pass_is_followed_by_the_shortest_pause_so_freed_gpus_are_handed_on_at_once() -> None:
    assert pause_after(0.002) == MIN_PAUSE_SECONDS
    assert pause_after(0.0) == MIN_PAUSE_SECONDS


@pytest.mark.parametrize("pass_seconds", [0.01, 0.05, 0.1])
def test_a_costlier_pass_keeps_the_pass_within_its_share_of_a_core(pass_seconds: float) -> None:
    pause = pause_after(pass_seconds)
    assert pass_seconds / (pass_seconds + pause) == pytest.approx(MAX_DUTY)


def test_a_pass_over_thousands_of_gangs_waits_at_most_the_longest_pause() -> None:
    assert pause_after(2.0) == MAX_PAUSE_SECONDS
    assert pause_after(30.0) == MAX_PAUSE_SECONDS


def test_the_pause_never_shrinks_as_the_pass_gets_costlier() -> None:
    costs = [i / 100 for i in range(0, 200)]
    pauses = [pause_after(c) for c in costs]
    assert pauses == sorted(pauses)
