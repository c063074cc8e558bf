"""Applies tensor, pipeline and data parallelism to a model, in that order (torchtitan's order).

- TP: Megatron-style. q/k/v and the MLP's first layer split by columns (heads / hidden units), the
  attention output and the MLP's second layer by rows, so each block needs one all-reduce forward
  and one backward per sub-layer. The head is column-split and gathered.
- PP: `torch.distributed.pipelining` stages over contiguous blocks, GPipe or 1F1B.
- DP: DDP (bucketed all-reduce overlapped with backward), ZeRO-1 (DDP + sharded optimizer state),
  FSDP2 full shard (ZeRO-3) or FSDP2 without resharding after forward (ZeRO-2 style: parameters stay
  gathered between forward and backward, gradients and optimizer state sharded).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel

from phalanx_trainer.models.gpt import GPT


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh) -> None:
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(),
            "mlp.w1": ColwiseParallel(),
            "mlp.w2": RowwiseParallel(),
        }
        parallelize_module(block, tp_mesh, plan)
    if model.head is not None:
        parallelize_module(model.head, tp_mesh, ColwiseParallel(output_layouts=Replicate()))


def apply_compile(model: GPT) -> None:
    for name, block in list(model.layers.items()):
        model.layers[name] = torch.compile(block)  # type: ignore[assignment]


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, reshard_after_forward: bool) -> nn.Module:
    blocks = list(model.layers.values()) if isinstance(model, GPT) else []
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
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
