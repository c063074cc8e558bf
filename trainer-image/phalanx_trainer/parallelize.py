"""Applies tensor, pipeline and data parallelism to a model, in that order (torchtitan's order).

What is model-specific (which blocks a pipeline stage keeps, the tensor-parallel plan, the units
FSDP shards and compile compiles) is the model's `ParallelizePlan`, written beside it
(models/gpt_parallel.py); `models.parallelize_plan` picks it. This file holds what fits any model:

- PP: `torch.distributed.pipelining` stages over the plan's split, GPipe or 1F1B (train.py).
- DP: DDP (bucketed all-reduce overlapped with backward), ZeRO-1 (DDP + sharded optimizer state),
  FSDP2 full shard (ZeRO-3) or FSDP2 without resharding after forward (ZeRO-2 style: parameters stay
  gathered between forward and backward, gradients and optimizer state sharded). Both gather
  parameters in the autocast dtype and reduce gradients in fp32 (precision.fsdp_mixed_precision).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel


class ParallelizePlan:
    """A model's parallelize plan. This default fits any nn.Module: data parallelism only, FSDP at
    the root, nothing compiled. Config validation refuses TP and PP for model kinds without a plan."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def split_for_stage(self, stage: int, num_stages: int) -> None:
        raise ValueError(f"{type(self.model).__name__} has no pipeline plan")

    def apply_tensor_parallel(self, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
        """Splits the model over `tp_mesh`; with loss_parallel the logits may stay vocabulary-split
        (the trainer computes the loss under torch's loss_parallel)."""
        raise ValueError(f"{type(self.model).__name__} has no tensor-parallel plan")

    def apply_compile(self) -> None:
        """Compiles the plan's units in place (none by default)."""

    def fsdp_units(self) -> list[nn.Module]:
        """Submodules FSDP shards on their own (each gathers only while it runs), before the root."""
        return default_fsdp_units(self.model)


def default_fsdp_units(model: nn.Module) -> list[nn.Module]:
    """FSDP units for a model without a plan: its repeated blocks (the members of every ModuleList
    and ModuleDict), or, when it has none, its direct children that hold parameters. A unit whose
    parameter another module outside it also holds (a tied embedding) stays with the root: FSDP
    cannot shard one parameter in two units. Innermost first, as fully_shard needs for nesting."""
    blocks = [
        member
        for module in model.modules()
        if isinstance(module, nn.ModuleList | nn.ModuleDict)
        for member in (module.values() if isinstance(module, nn.ModuleDict) else module)
    ]
    candidates = blocks or [child for child in model.children() if next(child.parameters(), None) is not None]
    holders: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            holders.setdefault(id(param), []).append(module)

    def self_contained(unit: nn.Module) -> bool:
        members = {id(module) for module in unit.modules()}
        return all(id(holder) in members for param in unit.parameters() for holder in holders[id(param)])

    return [unit for unit in reversed(candidates) if self_contained(unit)]


def apply_fsdp(
    model: nn.Module,
    units: list[nn.Module],
    dp_mesh: DeviceMesh,
    reshard_after_forward: bool,
    mp_policy: MixedPrecisionPolicy,
) -> nn.Module:
    for unit in units:
        fully_shard(unit, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
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
