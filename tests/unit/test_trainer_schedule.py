"""LR schedules: warmup, cosine, warmup-stable-decay and cyclic as multipliers of the base LR."""

from __future__ import annotations

import math

import pytest

from phalanx_trainer.config import ScheduleConfig
from phalanx_trainer.schedule import lr_multiplier

pytestmark = pytest.mark.unit


def test_linear_warmup_reaches_one_on_the_last_warmup_step() -> None:
    config = ScheduleConfig(kind="constant", warmup_steps=4)
    assert [lr_multiplier(s, config, 100) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_runs_from_one_to_the_floor() -> None:
    config = ScheduleConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert lr_multiplier(10, config, 110) == pytest.approx(1.0)
    assert lr_multiplier(60, config, 110) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway: cos(pi/2) = 0
    assert lr_multiplier(110, config, 110) == pytest.approx(0.1)
    assert lr_multiplier(35, config, 110) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_warmup_stable_decay_holds_then_decays_linearly_to_the_floor() -> None:
    config = ScheduleConfig(kind="wsd", warmup_steps=0, decay_fraction=0.2, min_lr_ratio=0.0)
    values = [lr_multiplier(s, config, 100) for s in range(100)]
    assert values[:80] == [1.0] * 80
    assert values[80] == pytest.approx(1 - 1 / 20)
    assert values[99] == pytest.approx(0.0)
    assert all(a > b for a, b in zip(values[80:], values[81:], strict=False))


def test_cyclic_is_a_triangle_between_floor_and_one() -> None:
    config = ScheduleConfig(kind="cyclic", cycle_steps=4, min_lr_ratio=0.2)
    values = [lr_multiplier(s, config, 100) for s in range(9)]
    assert values == pytest.approx([0.2, 0.6, 1.0, 0.6, 0.2, 0.6, 1.0, 0.6, 0.2])
