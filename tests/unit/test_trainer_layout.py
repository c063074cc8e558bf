"""The parallel layout is checked on the resolved sizes (dp = -1 included) before any process group,
model or mesh exists: a layout that cannot train is refused at start, naming the field to change."""

from __future__ import annotations

import pytest

from phalanx_trainer.config import ConfigError, load_config
from phalanx_trainer.parallel_dims import LayoutError, ParallelDims

pytestmark = pytest.mark.unit


def problems_at(world_size: int, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides, world_size)
    return caught.value.problems


def test_tensor_parallel_with_inferred_data_parallel_needs_a_sharded_dp_mode() -> None:
    # tp = 2 on 4 ranks leaves dp = 2; under DDP this failed later with "mixed torch.Tensor and DTensor".
    [problem] = problems_at(4, ["parallelism.tp=2"])
    assert problem.startswith("parallelism.dp_mode = 'ddp': tp = 2 with dp = 2 (world size 4 / (tp x pp))")
    assert 'use dp_mode = "fsdp" or "zero2"' in problem


def test_pipeline_with_inferred_data_parallel_needs_a_sharded_dp_mode() -> None:
    # pp = 2 on 4 ranks leaves dp = 2; under DDP or ZeRO-1 this hung.
    for mode in ("ddp", "zero1"):
        [problem] = problems_at(4, ["parallelism.pp=2", f"parallelism.dp_mode={mode}"])
        assert problem.startswith(f"parallelism.dp_mode = '{mode}': pp = 2 with dp = 2")
        assert 'use dp_mode = "fsdp" or "zero2"' in problem


def test_one_f_one_b_needs_at_least_one_micro_batch_per_stage() -> None:
    [problem] = problems_at(2, ["parallelism.pp=2", "parallelism.pp_microbatches=1", "data.batch_size=4"])
    assert problem == (
        "parallelism.pp_microbatches = 1 must be >= parallelism.pp = 2 under pp_schedule = '1f1b': "
        "set pp_microbatches = 2 or more, or pp_schedule = 'gpipe'"
    )


def test_good_layouts_are_accepted() -> None:
    load_config(None, ["parallelism.tp=2", "parallelism.dp_mode=fsdp"], 4)
    load_config(None, ["parallelism.pp=2", "parallelism.dp_mode=zero2"], 4)
    load_config(
        None, ["parallelism.pp=2", "parallelism.pp_microbatches=1", "parallelism.pp_schedule=gpipe"], 2
    )
    load_config(None, ["parallelism.tp=2"], 2)  # dp = 1: nothing to shard, DDP is not even built


def test_parallel_dims_refuse_a_bad_layout_themselves() -> None:
    with pytest.raises(LayoutError, match=r"dp x tp x pp = 2 x 2 x 1 = 4 != world size 8"):
        ParallelDims(dp=2, tp=2, pp=1, world_size=8, dp_mode="fsdp")
    with pytest.raises(LayoutError, match=r"parallelism.dp_mode = 'ddp': tp = 2 with dp = 2"):
        ParallelDims(dp=2, tp=2, pp=1, world_size=4, dp_mode="ddp")


def test_parallel_dims_answer_which_dimensions_are_enabled() -> None:
    dims = ParallelDims(dp=1, tp=2, pp=2, world_size=4)
    assert (dims.dp_enabled, dims.tp_enabled, dims.pp_enabled) == (False, True, True)
    dims = ParallelDims(dp=4, tp=1, pp=1, world_size=4)
    assert (dims.dp_enabled, dims.tp_enabled, dims.pp_enabled) == (True, False, False)
