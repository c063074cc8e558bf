"""Build on the meta device, shard, then initialise: no rank ever holds the whole model.

A model opts in with `init_parameter(name, tensor, generator)`, which fills one whole parameter or
buffer (named as in a one-process model). The trainer builds it on the meta device (no memory),
applies PP / TP / FSDP, allocates only each rank's part (`to_empty`) and then, one tensor at a time,
generates the whole tensor on the device from a generator seeded by (seed, name) and keeps this
rank's part of it. The values do not depend on the layout, so every layout starts from the
one-process weights; the peak extra memory is the largest single tensor. Tied parameters (an
embedding shared with the output head) stay one parameter, initialised once under the first name.

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


def tied_parameter_names(model: nn.Module) -> list[list[str]]:
    """Names that share one parameter (tied weights), each group in registration order."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def retie(model: nn.Module, groups: list[list[str]]) -> None:
    """Points every name of each group at the parameter of its first name."""
    for first, *others in groups:
        shared = model.get_parameter(first)
        for name in others:
            owner, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(owner), attribute, shared)


def initialise_after_sharding(model: nn.Module, device: torch.device, seed: int) -> None:
    """Allocates this rank's parts of a meta model on `device` and fills them (see the module doc)."""
    init = getattr(model, "init_parameter")  # noqa: B009 - checked by initialises_per_tensor
    # to_empty replaces each module's parameters on its own, so a tied embedding and head would come
    # back as two tensors and train untied: record the ties and restore them before initialising.
    tied = tied_parameter_names(model)
    model.to_empty(device=device)
    retie(model, tied)
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
