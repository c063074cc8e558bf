"""Build on the meta device, shard, then initialise: no rank ever holds the whole model.

A model opts in with `init_parameter(name, tensor, generator)`, which fills one whole parameter or
buffer (named as in a one-process model). The trainer builds it on the meta device (no memory),
applies PP / TP / FSDP, allocates only each rank's part (`to_empty`) and then, one tensor at a time,
generates the whole tensor on the device from a generator seeded by (seed, name) and keeps this
rank's part of it. The values do not depend on the layout, so every layout starts from the
one-process weights; the peak extra memory is the largest single tensor.

A model without the hook is built whole on the device under the seed, as its constructor
initialises it: it has to fit on one device before sharding. (Its builder runs twice, first on the
meta device, which is how the trainer finds out; constructors with side effects see both.)
"""

from __future__ import annotations

import zlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from phalanx_trainer.config import ModelConfig
from phalanx_trainer.models.registry import build_model


def initialises_per_tensor(model: nn.Module) -> bool:
    return callable(getattr(model, "init_parameter", None))


def build_for_sharding(config: ModelConfig, device: torch.device, seed: int) -> tuple[nn.Module, bool]:
    """(model, on_meta): on the meta device when it can initialise per tensor, else whole on `device`."""
    with torch.device("meta"):
        model = build_model(config)
    if initialises_per_tensor(model):
        return model, True
    torch.manual_seed(seed)
    return build_model(config).to(device), False


def one_process_name(name: str) -> str:
    return name.replace("_orig_mod.", "")  # torch.compile's wrapper


def initialise_after_sharding(model: nn.Module, device: torch.device, seed: int) -> None:
    """Allocates this rank's parts of a meta model on `device` and fills them (see the module doc)."""
    init = getattr(model, "init_parameter")  # noqa: B009 - checked by initialises_per_tensor
    model.to_empty(device=device)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    with torch.no_grad():
        for name, tensor in tensors:
            name = one_process_name(name)
            generator = torch.Generator(device=device)
            generator.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
            whole = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
            init(name, whole, generator)
            if isinstance(tensor, DTensor):
                # src_data_rank=None: every rank generated the same whole tensor, so each keeps its
                # part without a scatter (FSDP x TP's strided shards included).
                tensor.copy_(
                    distribute_tensor(whole, tensor.device_mesh, tensor.placements, src_data_rank=None)
                )
            else:
                tensor.copy_(whole)
