"""A small GPT: pre-norm blocks, causal attention, GELU MLP, learned positions, untied head.

Written for parallelism: q/k/v/o and the MLP are separate Linear layers so tensor parallelism can
split them column- and row-wise; blocks live in a ModuleDict keyed by index so a pipeline stage can
drop the blocks, embeddings or head it does not own and keep the others' names (checkpoints match).
The plan that does so lives beside this file, in gpt_parallel.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from phalanx_trainer.config import ModelConfig


def autocast_context(
    device: torch.device, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager[None]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 whatever the autocast dtype, cast back afterwards."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            out = F.layer_norm(x.float(), self.normalized_shape, self.weight, self.bias, self.eps)
        return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = d_model // n_heads
        self.wq = nn.Linear(d_model, d_model)
        self.wk = nn.Linear(d_model, d_model)
        self.wv = nn.Linear(d_model, d_model)
        self.wo = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Under tensor parallelism q/k/v hold only this rank's heads: derive the count from the width.
        q, k, v = (
            proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
            for proj in (self.wq, self.wk, self.wv)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        projected: torch.Tensor = self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
        return projected


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.gelu(self.w1(x)))
        return out


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1 = FP32LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.ln2 = FP32LayerNorm(d_model)
        self.mlp = FeedForward(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d_ff = config.d_ff or 4 * config.d_model
        self.tok_emb: nn.Embedding | None = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb: nn.Embedding | None = nn.Embedding(config.seq_len, config.d_model)
        self.layers = nn.ModuleDict(
            {str(i): Block(config.d_model, config.n_heads, d_ff) for i in range(config.n_layers)}
        )
        self.ln_f: nn.Module | None = FP32LayerNorm(config.d_model)
        self.head: nn.Linear | None = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.autocast_dtype: torch.dtype | None = None
        self.checkpoint_blocks = config.activation_checkpointing
        self.reset_parameters(config.init_std)

    def reset_parameters(self, std: float) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)

    def blocks(self) -> Iterator[nn.Module]:
        return iter(self.layers.values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first stage) or hidden states (later stages) -> logits (last) or hidden states."""
        with autocast_context(x.device, self.autocast_dtype):
            if self.tok_emb is not None and self.pos_emb is not None:
                positions = torch.arange(x.shape[1], device=x.device)
                h = self.tok_emb(x) + self.pos_emb(positions)
            else:
                h = x
            block: nn.Module
            for block in self.layers.values():
                if self.checkpoint_blocks and torch.is_grad_enabled():
                    h = checkpoint(block, h, use_reentrant=False)  # type: ignore[assignment]
                else:
                    h = block(h)
            if self.ln_f is not None:
                h = self.ln_f(h)
            if self.head is not None:
                h = self.head(h)
        out: torch.Tensor = h
        return out

    def flops_per_token(self) -> float:
        """Training FLOPs per token, PaLM's estimate: 6 x non-embedding params + 12 x layers x d x seq."""
        cfg = self.config
        d_ff = cfg.d_ff or 4 * cfg.d_model
        per_block = 4 * cfg.d_model * cfg.d_model + 2 * cfg.d_model * d_ff
        dense = cfg.n_layers * per_block + cfg.d_model * cfg.vocab_size
        return 6.0 * dense + 12.0 * cfg.n_layers * cfg.d_model * cfg.seq_len
