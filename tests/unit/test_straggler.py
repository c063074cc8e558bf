"""Which ranks are stragglers (trainer-image/phalanx_trainer/straggler.py) and the slow-rank fault hook."""

from __future__ import annotations

import pytest

from phalanx_trainer.faults import slow_rank_delay
from phalanx_trainer.straggler import MAX_REPORTED, StragglerTracker

pytestmark = pytest.mark.unit


def test_a_rank_over_the_factor_for_the_steps_in_a_row_is_a_straggler() -> None:
    tracker = StragglerTracker(factor=2.0, steps=3)
    assert tracker.update([0.1, 0.25, 0.1, 0.1]) == []
    assert tracker.update([0.1, 0.25, 0.1, 0.1]) == []
    (found,) = tracker.update([0.1, 0.25, 0.1, 0.1])
    assert (found.rank, found.steps) == (1, 3) and found.ratio == pytest.approx(2.5)
    assert found.as_json() == {"rank": 1, "ratio": 2.5, "steps": 3}


def test_one_step_under_the_factor_starts_the_count_again() -> None:
    tracker = StragglerTracker(factor=2.0, steps=2)
    tracker.update([0.1, 0.3])
    tracker.update([0.1, 0.15])  # a normal step in between
    assert tracker.update([0.1, 0.3]) == []
    assert [s.rank for s in tracker.update([0.1, 0.3])] == [1]


def test_two_ranks_compare_with_each_other_not_with_a_median_that_includes_the_slow_one() -> None:
    # With two ranks a median including the slow one could never be exceeded twice over.
    tracker = StragglerTracker(factor=2.0, steps=1)
    assert [s.rank for s in tracker.update([0.05, 0.5])] == [1]


def test_a_gang_of_equal_ranks_and_noise_under_the_factor_has_no_straggler() -> None:
    tracker = StragglerTracker(factor=2.0, steps=5)
    noisy = [[0.1, 0.15, 0.09, 0.18], [0.17, 0.1, 0.12, 0.1], [0.1, 0.1, 0.19, 0.1]] * 20
    assert all(tracker.update(step) == [] for step in noisy)


def test_the_slowest_come_first_and_at_most_a_few_are_reported() -> None:
    tracker = StragglerTracker(factor=2.0, steps=1)
    seconds = [0.1] * 100
    for rank in range(20):
        seconds[rank] = 0.3 + rank * 0.01
    found = tracker.update(seconds)
    assert len(found) == MAX_REPORTED and found[0].rank == 19


@pytest.mark.parametrize(
    ("factor", "steps", "field"), [(1.0, 5, "straggler_factor"), (2.0, 0, "straggler_steps")]
)
def test_bad_settings_name_the_field(factor: float, steps: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StragglerTracker(factor, steps)


def test_the_slow_rank_hook_applies_to_its_rank_only_and_names_the_variable_when_malformed() -> None:
    env = {"PHALANX_FAULT_SLOW_RANK": "1:0.05"}
    assert slow_rank_delay(1, env) == 0.05 and slow_rank_delay(0, env) == 0.0
    assert slow_rank_delay(0, {}) == 0.0
    with pytest.raises(ValueError, match="PHALANX_FAULT_SLOW_RANK"):
        slow_rank_delay(0, {"PHALANX_FAULT_SLOW_RANK": "one"})
