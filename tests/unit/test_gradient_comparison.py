"""The trainer matrix compares gradients per tensor: a small tensor (a LayerNorm, q/k biases) that is
wrong must fail even when the model's largest gradient dwarfs it."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.trainer_harness import max_relative_difference

pytestmark = pytest.mark.unit


def reference() -> dict[str, torch.Tensor]:
    return {"mlp.weight": torch.ones(8, 8), "ln.bias": torch.full((8,), 1e-3)}


def test_a_small_tensor_off_by_ten_percent_is_a_ten_percent_difference() -> None:
    wrong = {name: tensor.clone() for name, tensor in reference().items()}
    wrong["ln.bias"] *= 1.1
    assert max_relative_difference(wrong, reference()) == pytest.approx(0.1, rel=1e-3)


def test_a_tensor_that_is_numerically_zero_is_measured_against_the_floor_not_itself() -> None:
    """Rounding noise on a gradient that is zero in exact arithmetic (the attention key bias) is not
    a 100% error: below the floor (1e-4 of the largest tensor's norm) it counts against the floor."""
    want = {**reference(), "wk.bias": torch.full((8,), 1e-11)}
    got = {**reference(), "wk.bias": torch.full((8,), -1e-11)}
    floor = 1e-4 * float(want["mlp.weight"].norm())
    assert max_relative_difference(got, want) == pytest.approx(float((got["wk.bias"] * 2).norm()) / floor)
    assert max_relative_difference(got, want) < 1e-7  # not 2.0, its own relative error


def test_identical_gradients_differ_by_nothing() -> None:
    assert max_relative_difference(reference(), reference()) == 0.0
