"""A user's own model for the trainer tests (`model.kind = custom`): no `autocast_dtype`, no FLOPs
estimate, no parallelize plan; plain torch layers, with repeated blocks in a ModuleList."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from phalanx_trainer.config import ModelConfig

# The device type of the parameters as each builder call saw them (checked in one-process tests).
BUILT_ON: list[str] = []


class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(F.gelu(self.up(x)))
        return out


class TinyLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Residual(config.d_model) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def init_parameter(self, name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        """Fills one whole parameter (the trainer's per-tensor initialisation hook)."""
        if name.endswith("bias"):
            tensor.zero_()
        elif name.startswith("norm."):
            tensor.fill_(1.0)
        else:
            tensor.normal_(0.0, 0.02, generator=generator)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        logits: torch.Tensor = self.head(self.norm(h))
        return logits


def tiny_lm(config: ModelConfig) -> TinyLM:
    model = TinyLM(config)
    BUILT_ON.append(next(model.parameters()).device.type)
    return model


class TinyLMWithoutInit(TinyLM):
    """The same model, left to initialise itself in its constructor (most users' models)."""

    init_parameter = None  # type: ignore[assignment]


def tiny_lm_without_init(config: ModelConfig) -> TinyLMWithoutInit:
    model = TinyLMWithoutInit(config)
    BUILT_ON.append(next(model.parameters()).device.type)
    return model


class TinyLMTied(TinyLM):
    """The same model with its output head tied to the embedding (one parameter, two modules)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.head.weight = self.embed.weight


def tiny_lm_tied(config: ModelConfig) -> TinyLMTied:
    return TinyLMTied(config)
