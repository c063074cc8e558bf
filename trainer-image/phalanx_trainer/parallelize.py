"""Applies tensor, pipeline and data parallelism to a model, in that order (torchtitan's order).

What is model-specific (which blocks a pipeline stage keeps, the tensor-parallel plan, the units
FSDP shards and compile compiles) is the model's `ParallelizePlan`, written beside it
(models/gpt_parallel.py); `models.parallelize_plan` picks it. This file holds what fits any model:

- PP: `torch.distributed.pipelining` stages over the plan's split, GPipe or 1F1B (train.py).
- DP: DDP (bucketed all-reduce overlapped with backward), ZeRO-1 (DDP + sharded optimizer state),
  FSDP2 full shard (ZeRO-3) or FSDP2 without resharding after forward (ZeRO-2 style: parameters stay
  gathered between forward and backward, gradients and optimizer state sharded).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel


class ParallelizePlan:
    """A model's parallelize plan. This default fits any nn.Module: data parallelism only, FSDP at
    the root, nothing compiled. Config validation refuses TP and PP for model kinds without a plan."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def split_for_stage(self, stage: int, num_stages: int) -> None:
        raise ValueError(f"{type(self.model).__name__} has no pipeline plan")

    def apply_tensor_parallel(self, tp_mesh: DeviceMesh) -> None:
        raise ValueError(f"{type(self.model).__name__} has no tensor-parallel plan")

    def apply_compile(self) -> None:
        """Compiles the plan's units in place (none by default)."""

    def fsdp_units(self) -> list[nn.Module]:
        """Submodules FSDP shards on their own (each gathers only while it runs), before the root."""
        return []


def apply_fsdp(
    model: nn.Module, units: list[nn.Module], dp_mesh: DeviceMesh, reshard_after_forward: bool
) -> nn.Module:
    for unit in units:
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    return model


def apply_ddp(
    model: nn.Module, dp_mesh: DeviceMesh, bucket_mb: float, device: torch.device
) -> DistributedDataParallel:
    # No static_graph: it breaks no_sync() (accumulation micro-steps fail an internal reducer
    # assert), and without find_unused_parameters DDP does no per-step graph search to save anyway;
    # buckets are still rebuilt in the first backward's order.
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        process_group=dp_mesh.get_group(),
        bucket_cap_mb=bucket_mb,
    )
