"""Model construction by kind, and the `module:function` extension point for users' own code."""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from phalanx_trainer.config import ModelConfig
from phalanx_trainer.models.gpt import GPT
from phalanx_trainer.models.gpt_parallel import GPTParallelizePlan
from phalanx_trainer.models.mlp import MLP
from phalanx_trainer.parallelize import ParallelizePlan


def load_object(spec: str) -> Any:
    """Imports `package.module:attribute`."""
    module_name, _, attribute = spec.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"{module_name} has no attribute {attribute!r}") from None


def build_model(config: ModelConfig) -> nn.Module:
    if config.kind == "gpt":
        return GPT(config)
    if config.kind == "mlp":
        return MLP(config)
    model = load_object(config.custom)(config)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{config.custom} returned {type(model).__name__}, not an nn.Module")
    return model


def parallelize_plan(model: nn.Module) -> ParallelizePlan:
    """The model's own TP / PP / FSDP / compile plan; data parallelism alone for other models."""
    if isinstance(model, GPT):
        return GPTParallelizePlan(model)
    return ParallelizePlan(model)


def model_flops_per_token(model: nn.Module) -> float:
    """The model's own estimate when it has one, else 6 x parameters (forward + backward)."""
    estimate = getattr(model, "flops_per_token", None)
    if callable(estimate):
        return float(estimate())
    return 6.0 * sum(p.numel() for p in model.parameters())
