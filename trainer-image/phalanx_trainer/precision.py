"""Mixed precision for any model: trainer-level autocast, FSDP's gather/reduce dtypes, and dynamic
loss scaling for fp16.

Parameters and optimizer state stay fp32 (master weights). The trainer wraps the model's forward in
autocast (the model needs no precision attribute of its own), so matmuls run in bf16/fp16 while
autocast's fp32 ops, LayerNorm (FP32LayerNorm) and the loss (on fp32 logits) stay fp32. Under FSDP
and ZeRO-2, `fsdp_mixed_precision` gathers parameters in the low dtype (half the all-gather bytes)
and reduces gradients in fp32 into fp32 shards. The scaler works on local shards and agrees on
overflow with one all-reduce, so it serves DDP, FSDP, TP and PP alike.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from phalanx_trainer.config import PrecisionConfig

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def apply_autocast(model: nn.Module, device_type: str, dtype: torch.dtype | None) -> None:
    """Runs `model.forward` under autocast from now on (an instance attribute, so DDP, FSDP and the
    pipeline stage, which all call the module, get it; parameter names do not change)."""
    if dtype is None:
        return
    inner = model.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=dtype):
            return inner(*args, **kwargs)

    model.forward = forward  # type: ignore[method-assign]


def fsdp_mixed_precision(dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """Gather parameters in the autocast dtype, reduce gradients in fp32; all fp32 without one."""
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype is not None else None)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class DynamicLossScaler:
    """Scales the loss up, skips steps whose gradients overflow, backs off and grows the scale."""

    def __init__(self, config: PrecisionConfig) -> None:
        self.enabled = config.dtype == "fp16"
        self.scale = config.initial_scale if self.enabled else 1.0
        self.growth_factor = config.growth_factor
        self.backoff_factor = config.backoff_factor
        self.growth_interval = config.growth_interval
        self.good_steps = 0
        self.skipped_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_and_check(self, params: Iterable[torch.Tensor], group: Any = None) -> bool:
        """Divides gradients by the scale; True when any rank saw inf or NaN (then skip the step)."""
        if not self.enabled:
            return False
        grads = [local_tensor(p.grad) for p in params if p.grad is not None]
        inverse = 1.0 / self.scale
        total = torch.zeros(1)
        if grads:
            torch._foreach_mul_(grads, inverse)
            total = torch.stack([g.float().abs().sum() for g in grads]).sum().reshape(1).cpu()
        found = torch.tensor([0.0 if bool(torch.isfinite(total).all()) else 1.0])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(found, op=dist.ReduceOp.MAX, group=group)
        return bool(found.item() > 0)

    def update(self, found_overflow: bool) -> None:
        if not self.enabled:
            return
        if found_overflow:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped_steps += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scale = float(state_dict["scale"])
        self.good_steps = int(state_dict["good_steps"])
        self.skipped_steps = int(state_dict["skipped_steps"])
