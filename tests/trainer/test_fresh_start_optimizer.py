"""A fresh start with checkpointing on trains exactly like one with checkpointing off.

The resume looks for a checkpoint before the first step; torch's get_state_dict, which it calls to learn
the live state's layout, creates missing optimizer state by stepping the optimizer once with zero
gradients at lr 0. Left in place, that step counts: AdamW's bias correction then starts at step 2, and
the run's second loss differs from the same run without a checkpoint directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from phalanx_trainer.config import load_config
from phalanx_trainer.distenv import DistEnv
from phalanx_trainer.logs import EventLog
from phalanx_trainer.train import Trainer
from tests.trainer.trainer_harness import TINY

pytestmark = pytest.mark.trainer

STEPS = 3


def trained(checkpoint_dir: str) -> Trainer:
    config = load_config(None, [*TINY, f"job.steps={STEPS}", f"checkpoint.dir={checkpoint_dir}"], 1)
    trainer = Trainer(config, DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 0, 0, 60.0), log=EventLog(rank=1))
    assert trainer.train() == 0
    trainer.close()
    return trainer


def test_fresh_start_with_a_checkpoint_directory_counts_only_real_optimizer_steps(tmp_path: Path) -> None:
    without = trained("''")
    with_checkpoints = trained(str(tmp_path / "ckpt"))
    steps = {float(state["step"]) for state in with_checkpoints.optimizer.state.values()}
    assert steps == {float(STEPS)}, f"AdamW counted {steps} steps after {STEPS}"
    for (name, got), want in zip(
        with_checkpoints.model.named_parameters(), without.model.parameters(), strict=True
    ):
        assert torch.equal(got, want), f"{name} differs from the run without checkpoints"
