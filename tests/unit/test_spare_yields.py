"""The hand-off of spares asked to yield, from the admission pass to their jobs' reconciles."""

from __future__ import annotations

import pytest

from phalanx.controller.spare_yields import YIELD_HOLD_SECONDS, SpareYields

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_ask_is_kept_once_per_spare_until_it_expires_or_the_job_is_forgotten() -> None:
    clock = Clock()
    yields = SpareYields(clock)
    assert yields.ask("ns/a", "uid-0", "for ns/head") is True
    assert yields.ask("ns/a", "uid-0", "for ns/other") is False, "asked once: the first reason stays"
    assert yields.of("ns/a") == {"uid-0": "for ns/head"} and yields.of("ns/b") == {}
    clock.now += YIELD_HOLD_SECONDS
    assert yields.of("ns/a") == {}, "expired"
    yields.ask("ns/a", "uid-1", "for ns/head")
    yields.forget("ns/a")
    assert yields.of("ns/a") == {}


def test_an_expired_ask_asked_again_is_a_new_ask() -> None:
    clock = Clock()
    yields = SpareYields(clock)
    yields.ask("ns/a", "uid-0", "for ns/head")
    clock.now += YIELD_HOLD_SECONDS
    assert yields.ask("ns/a", "uid-0", "for ns/next") is True
    assert yields.of("ns/a") == {"uid-0": "for ns/next"}
