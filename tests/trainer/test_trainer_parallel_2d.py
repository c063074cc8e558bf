"""Two-dimensional layouts on 4 processes train like one process (measured: within 5e-7 nats and
1.4e-7 of the largest gradient; asserted 1e-5 like the 2-process layouts)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.trainer.trainer_harness import GLOBAL_BATCH, max_relative_difference, run_spawned, run_trainer

pytestmark = pytest.mark.trainer

STEPS = 2
LAYOUTS = {
    "fsdp2_x_tp2": [f"data.batch_size={GLOBAL_BATCH // 2}", "parallelism.tp=2", "parallelism.dp_mode=fsdp"],
    "pp2_x_fsdp2": [f"data.batch_size={GLOBAL_BATCH // 2}", "parallelism.pp=2", "parallelism.dp_mode=fsdp"],
}


@pytest.fixture(scope="module")
def four_processes() -> dict[str, Any]:
    return run_spawned(LAYOUTS, world_size=4, steps=STEPS)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_four_process_layout_matches_one_process(layout: str, four_processes: dict[str, Any]) -> None:
    reference = run_trainer([f"data.batch_size={GLOBAL_BATCH}"], world_size=1, rank=0, steps=STEPS)
    run = four_processes[layout]
    assert "error" not in run, run.get("error")
    for got, want in zip(run["losses"], reference["losses"], strict=True):
        assert abs(got - want) <= 1e-5
    assert max_relative_difference(run["grads"], reference["grads"]) <= 1e-5
