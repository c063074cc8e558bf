"""Precision and memory for any model: the trainer, not the model, applies autocast; FSDP gathers
parameters in bf16 and reduces gradients in fp32; a custom model's blocks are FSDP units of their
own; models that can initialise one tensor at a time are built on the meta device and initialised
after sharding, and still train like one process."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.trainer import custom_models
from tests.trainer.test_trainer_matrix import assert_matches, needs_cpu, tolerances
from tests.trainer.trainer_harness import GLOBAL_BATCH, run_ranks, run_trainer

pytestmark = pytest.mark.trainer

STEPS = 3
CUSTOM = ["model.kind=custom", "model.custom=tests.trainer.custom_models:tiny_lm"]
CUSTOM_WHOLE = ["model.kind=custom", "model.custom=tests.trainer.custom_models:tiny_lm_without_init"]
TIED = ["model.kind=custom", "model.custom=tests.trainer.custom_models:tiny_lm_tied"]


def one_process(overrides: list[str]) -> dict[str, Any]:
    return run_trainer([*overrides, f"data.batch_size={GLOBAL_BATCH}"], world_size=1, rank=0, steps=STEPS)


@functools.cache
def one_process_cached(key: tuple[str, ...]) -> dict[str, Any]:
    return one_process(list(key))


@needs_cpu("bf16")
def test_a_custom_model_runs_its_matmuls_in_bf16() -> None:
    run = one_process([*CUSTOM, "precision.dtype=bf16"])
    assert run["linear_dtypes"]["output"] == {"bfloat16"}
    assert run["grad_dtypes"] == {"float32"}  # master weights stay fp32


@needs_cpu("fp16")
def test_a_custom_model_under_fp16_runs_in_fp16_so_its_loss_is_scaled_for_a_reason() -> None:
    run = one_process([*CUSTOM, "precision.dtype=fp16"])
    assert run["linear_dtypes"]["output"] == {"float16"}
    assert run["loss_scale"] > 1


def test_a_model_that_initialises_per_tensor_is_built_on_the_meta_device() -> None:
    custom_models.BUILT_ON.clear()
    one_process(CUSTOM)
    assert custom_models.BUILT_ON == ["meta"]


def test_a_model_without_a_per_tensor_init_is_built_whole_on_the_device() -> None:
    custom_models.BUILT_ON.clear()
    one_process(CUSTOM_WHOLE)
    assert custom_models.BUILT_ON[-1] == "cpu"


def test_a_tied_model_built_on_the_meta_device_stays_tied() -> None:
    """to_empty gives every module its own tensor: the head must be re-pointed at the embedding."""
    run = one_process(TIED)
    assert run["alias_groups"] == [["embed.weight", "head.weight"]]


def two_rank_cases() -> dict[str, list[str]]:
    half = f"data.batch_size={GLOBAL_BATCH // 2}"
    cases = {
        f"{mode}-{model}-{dtype}": [
            *overrides,
            f"parallelism.dp_mode={mode}",
            half,
            f"precision.dtype={dtype}",
        ]
        for mode in ("fsdp", "zero2")
        for model, overrides in (("gpt", []), ("custom", CUSTOM), ("custom_whole", CUSTOM_WHOLE))
        for dtype in ("fp32", "bf16")
    }
    for mode in ("fsdp", "zero2"):
        cases[f"{mode}-tied-fp32"] = [*TIED, f"parallelism.dp_mode={mode}", half]
    return cases


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, Any]:
    return run_ranks(two_rank_cases(), world_size=2, steps=STEPS)


@needs_cpu("bf16")
@pytest.mark.parametrize("mode", ["fsdp", "zero2"])
@pytest.mark.parametrize("model", ["gpt", "custom"])
def test_fsdp_gathers_bf16_parameters_and_keeps_fp32_gradients(
    mode: str, model: str, two_ranks: dict[str, Any]
) -> None:
    run = two_ranks[f"{mode}-{model}-bf16"]
    assert "error" not in run, run.get("error")
    assert run["linear_dtypes"]["weight"] == {"bfloat16"}  # half the all-gather bytes
    assert run["grad_dtypes"] == {"float32"}  # reduced in fp32, sharded fp32 master gradients


@pytest.mark.parametrize("model", ["custom", "custom_whole"])
def test_fsdp_shards_a_custom_models_blocks_on_their_own(model: str, two_ranks: dict[str, Any]) -> None:
    run = two_ranks[f"fsdp-{model}-fp32"]
    assert "error" not in run, run.get("error")
    assert {"blocks.0", "blocks.1", "<root>"} <= set(run["fsdp_units"])


@pytest.mark.parametrize("dtype", ["fp32", pytest.param("bf16", marks=needs_cpu("bf16"))])
@pytest.mark.parametrize("mode", ["fsdp", "zero2"])
@pytest.mark.parametrize("model", ["custom", "custom_whole"])
def test_a_sharded_custom_model_trains_like_one_process(
    model: str, mode: str, dtype: str, two_ranks: dict[str, Any]
) -> None:
    overrides = CUSTOM if model == "custom" else CUSTOM_WHOLE
    reference = one_process_cached((*overrides, f"precision.dtype={dtype}"))
    layout = [f"parallelism.dp_mode={mode}"]
    assert_matches(two_ranks[f"{mode}-{model}-{dtype}"], reference, *tolerances(layout, dtype))


@pytest.mark.parametrize("mode", ["fsdp", "zero2"])
def test_a_sharded_tied_model_stays_tied_and_trains_like_one_process(
    mode: str, two_ranks: dict[str, Any]
) -> None:
    run = two_ranks[f"{mode}-tied-fp32"]
    assert "error" not in run, run.get("error")
    assert run["alias_groups"] == [["embed.weight", "head.weight"]]
    reference = one_process_cached((*TIED, "precision.dtype=fp32"))
    assert_matches(run, reference, *tolerances([f"parallelism.dp_mode={mode}"], "fp32"))


@needs_cpu("bf16")
def test_one_rank_with_a_process_group_shards_too() -> None:
    """One GPU under bench/gpu_check.py: dp_mode = fsdp still takes FSDP's path and bf16 gathers."""
    [run] = run_ranks(
        {"alone": ["parallelism.dp_mode=fsdp", "precision.dtype=bf16", f"data.batch_size={GLOBAL_BATCH}"]},
        world_size=1,
        steps=1,
    ).values()
    assert "error" not in run, run.get("error")
    assert "<root>" in run["fsdp_units"]
    assert run["linear_dtypes"]["weight"] == {"bfloat16"}
