"""An MLP language model: each token predicts the next from its own embedding (a bigram model)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from phalanx_trainer.config import ModelConfig
from phalanx_trainer.models.gpt import FP32LayerNorm


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.d_ff or 4 * config.d_model
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.fc1 = nn.Linear(config.d_model, hidden)
        self.fc2 = nn.Linear(hidden, config.d_model)
        self.norm = FP32LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def init_parameter(self, name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        """torch's own defaults, one whole tensor at a time (the trainer builds on the meta device):
        N(0, 1) embeddings, LayerNorm ones and zeros, Linear U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        owner, _, kind = name.rpartition(".")
        if owner == "embed":
            tensor.normal_(0.0, 1.0, generator=generator)
        elif owner == "norm":
            tensor.fill_(1.0) if kind == "weight" else tensor.zero_()
        else:
            linear = self.get_submodule(owner)
            assert isinstance(linear, nn.Linear)
            bound = linear.in_features**-0.5
            tensor.uniform_(-bound, bound, generator=generator)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = h + self.fc2(F.gelu(self.fc1(h)))
        logits: torch.Tensor = self.head(self.norm(h))
        return logits

    def flops_per_token(self) -> float:
        cfg = self.config
        hidden = cfg.d_ff or 4 * cfg.d_model
        return 6.0 * (2 * cfg.d_model * hidden + cfg.d_model * cfg.vocab_size)
