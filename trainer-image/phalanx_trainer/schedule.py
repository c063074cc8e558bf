"""Learning-rate schedules as pure multipliers of the base LR (wrapped by torch's LambdaLR)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from phalanx_trainer.config import ScheduleConfig


def lr_multiplier(step: int, config: ScheduleConfig, total_steps: int) -> float:
    """Multiplier for the update applied at optimizer step `step` (0-based)."""
    if config.warmup_steps > 0 and step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    floor = config.min_lr_ratio
    if config.kind == "constant":
        return 1.0
    if config.kind == "cosine":
        span = max(1, total_steps - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / span)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if config.kind == "wsd":
        decay_steps = max(1, round(config.decay_fraction * total_steps))
        decay_start = total_steps - decay_steps
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start + 1) / decay_steps)
        return 1.0 - (1.0 - floor) * progress
    if config.kind == "cyclic":
        # Triangle: floor -> 1 over the first half of each cycle, back to floor over the second.
        half = max(1, config.cycle_steps // 2)
        position = (step - config.warmup_steps) % (2 * half)
        rising = position / half if position < half else (2 * half - position) / half
        return floor + (1.0 - floor) * rising
    raise ValueError(f"unknown schedule kind {config.kind!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: ScheduleConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    multiplier: Callable[[int], float] = lambda step: lr_multiplier(step, config, total_steps)  # noqa: E731
    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
