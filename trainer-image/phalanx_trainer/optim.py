"""Optimizers: AdamW and SGD from torch, LAMB and LARS written against their published rules.

LAMB: You et al., "Large Batch Optimization for Deep Learning" (2019), Algorithm 2.
LARS: You et al., "Large Batch Training of Convolutional Networks" (2017), Algorithm 1.
Per-tensor norms are taken over the whole tensor even when FSDP or TP shards it (DTensor).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from phalanx_trainer.config import OptimizerConfig


def full_norm(tensor: torch.Tensor) -> float:
    """L2 norm of the whole logical tensor, gathering across shards for a DTensor."""
    norm = torch.linalg.vector_norm(tensor.detach(), dtype=torch.promote_types(tensor.dtype, torch.float32))
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


class Lamb(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                step = state["step"]
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(param.grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
                m_hat = exp_avg / (1 - beta1**step)
                v_hat = exp_avg_sq / (1 - beta2**step)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(param, alpha=group["weight_decay"])
                weight_norm, update_norm = full_norm(param), full_norm(update)
                trust = weight_norm / update_norm if weight_norm > 0 and update_norm > 0 else 1.0
                param.add_(update, alpha=-group["lr"] * trust)
        return loss


class Lars(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
    ) -> None:
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": trust_coefficient}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            decay = group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                weight_norm, grad_norm = full_norm(param), full_norm(param.grad)
                local_lr = 1.0
                if weight_norm > 0 and grad_norm > 0:
                    local_lr = group["eta"] * weight_norm / (grad_norm + decay * weight_norm)
                direction = param.grad.add(param, alpha=decay) if decay else param.grad.clone()
                state = self.state[param]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(param)
                velocity = state["velocity"]
                velocity.mul_(group["momentum"]).add_(direction, alpha=group["lr"] * local_lr)
                param.sub_(velocity)
        return loss


def optimizer_class_and_kwargs(
    config: OptimizerConfig, device: torch.device
) -> tuple[type[Any], dict[str, Any]]:
    """The class and keyword arguments, separate so ZeroRedundancyOptimizer can build it per shard."""
    if config.name == "adamw":
        fused = config.fused == "on" or (config.fused == "auto" and device.type == "cuda")
        return torch.optim.AdamW, {
            "lr": config.lr,
            "betas": (config.beta1, config.beta2),
            "eps": config.eps,
            "weight_decay": config.weight_decay,
            "fused": fused or None,
            # foreach kernels change the summation order vs the single-tensor path on some
            # layouts; keep the default so sharded and replicated runs compare tightly.
        }
    if config.name == "lamb":
        return Lamb, {
            "lr": config.lr,
            "betas": (config.beta1, config.beta2),
            "eps": config.eps,
            "weight_decay": config.weight_decay,
        }
    if config.name == "lars":
        return Lars, {
            "lr": config.lr,
            "momentum": config.momentum,
            "weight_decay": config.weight_decay,
            "trust_coefficient": config.trust_coefficient,
        }
    if config.name == "sgd":
        return torch.optim.SGD, {
            "lr": config.lr,
            "momentum": config.momentum,
            "weight_decay": config.weight_decay,
        }
    raise ValueError(f"unknown optimizer {config.name!r}")
