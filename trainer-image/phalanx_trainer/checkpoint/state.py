"""Turning the trainer's app_state into what we write, and back.

Model and optimizer go through torch's distributed state-dict helpers (FQN keys whatever the wrapping:
DDP, FSDP2, TP), and their tensors (plain or DTensor) are written with DCP, which reshards on load.
Their non-tensor leaves (learning rate, betas, ...) and every other Stateful are small and per rank:
they are written to a per-rank file that loads under `weights_only=True`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from phalanx_trainer.checkpoint.records import Stateful

TENSOR_MARK = "__phalanx_dcp_tensor__"
SHARDED_KEYS = ("model", "optimizer")


def _module_and_optimizer(
    app_state: Mapping[str, Any],
) -> tuple[nn.Module | None, torch.optim.Optimizer | None]:
    """The module and the optimizer whose state goes through DCP.

    For ZeRO-1 that is this rank's partition: `ZeroRedundancyOptimizer.optim`, a plain optimizer over
    the parameters this rank owns. Its state has the same FQN keys as any other layout's, each written
    by the rank that owns it, so it is asynchronous, verified and resharded like the rest.
    """
    model, optimizer = app_state.get("model"), app_state.get("optimizer")
    if not isinstance(model, nn.Module):
        return None, None
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return model, optimizer.optim
    return model, optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def checkpointed_optimizer(app_state: Mapping[str, Any]) -> torch.optim.Optimizer | None:
    """The optimizer whose state DCP writes (under ZeRO-1, this rank's partition), if any."""
    return _module_and_optimizer(app_state)[1]


def _per_rank_view(app_state: Mapping[str, Any]) -> dict[str, Any]:
    """The entries saved per rank: everything but the model and optimizer that DCP covers."""
    module, optim = _module_and_optimizer(app_state)
    handled = {key for key, value in (("model", module), ("optimizer", optim)) if value is not None}
    return {name: obj for name, obj in app_state.items() if name not in handled}


def collect(app_state: Mapping[str, Stateful | Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(sharded state of model/optimizer, per-rank state of everything else)."""
    module, optim = _module_and_optimizer(app_state)
    sharded: dict[str, Any] = {}
    zero = app_state.get("optimizer")
    if isinstance(zero, ZeroRedundancyOptimizer) and optim is not None:
        # The LR schedule writes ZeRO's exposed groups; ZeRO copies them into its partition only at
        # the next step, so the partition still holds the last step's rate: copy them first.
        for exposed, local in zip(zero.param_groups, optim.param_groups, strict=True):
            local.update({key: value for key, value in exposed.items() if key != "params"})
    if module is not None and optim is not None:
        sharded["model"], sharded["optimizer"] = get_state_dict(module, optim)
    elif module is not None:
        sharded["model"] = get_model_state_dict(module)
    per_rank = {name: obj.state_dict() for name, obj in _per_rank_view(app_state).items()}
    return sharded, per_rank


def replicated_prefixes(app_state: Mapping[str, Any]) -> tuple[str, ...]:
    """DCP keys of the state every data-parallel replica of DDP or ZeRO-1 holds alike: the model's,
    and the optimizer's unless ZeRO-1 partitions it."""
    if isinstance(app_state.get("optimizer"), ZeroRedundancyOptimizer):
        return ("model/",)
    return ("model/", "optimizer/")


def split_tensors(tree: Any, prefix: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """Replace every tensor leaf by a marker naming its DCP key; return (skeleton, key -> tensor)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[path] = node
            return {TENSOR_MARK: path}
        if isinstance(node, dict):
            return {key: walk(value, f"{path}/{key}" if path else str(key)) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value, f"{path}/{index}") for index, value in enumerate(node)]
        return node

    return walk(tree, prefix), tensors


def fill_tensors(skeleton: Any, lookup: Callable[[str], torch.Tensor]) -> Any:
    """Inverse of split_tensors: put a tensor back at every marker."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {TENSOR_MARK}:
            return lookup(str(skeleton[TENSOR_MARK]))
        return {key: fill_tensors(value, lookup) for key, value in skeleton.items()}
    if isinstance(skeleton, list):
        return [fill_tensors(value, lookup) for value in skeleton]
    return skeleton


def overlay_plain_values(live: Any, saved: Any) -> Any:
    """The live structure (its tensors, now loaded by DCP) with the saved non-tensor values put in.

    Walks the live skeleton so that a rank takes only what it holds (a pipeline stage, after a layout
    change); optimizer "params" lists name the live parameters and stay as they are.
    """
    if isinstance(live, dict):
        if set(live) == {TENSOR_MARK}:
            return live
        if not isinstance(saved, dict):
            return live
        return {
            key: overlay_plain_values(value, saved[key]) if key in saved and key != "params" else value
            for key, value in live.items()
        }
    if isinstance(live, list):
        if not isinstance(saved, list) or len(saved) != len(live):
            return live
        return [overlay_plain_values(value, other) for value, other in zip(live, saved, strict=True)]
    if isinstance(saved, dict | list):
        return live
    return saved


def _optimizer_states(sharded: Any) -> dict[str, Any]:
    """FQN -> per-parameter optimizer state of a sharded skeleton ({} when there is none)."""
    optimizer = sharded.get("optimizer") if isinstance(sharded, dict) else None
    states = optimizer.get("state") if isinstance(optimizer, dict) else None
    return states if isinstance(states, dict) else {}


def merge_optimizer_state(own: Any, others: Iterable[Any]) -> Any:
    """`own` (this rank's saved skeleton) with the per-parameter optimizer state of every FQN it lacks
    taken from `others` (the writer's other ranks), the first that holds it winning.

    ZeRO-1 and pipeline stages split the optimizer by parameter, and after a resize a rank may hold
    parameters another rank saved: their tensors DCP reshards, their plain values (LAMB's step) are
    only in that rank's file.
    """
    states = dict(_optimizer_states(own))
    for other in others:
        for fqn, state in _optimizer_states(other).items():
            states.setdefault(fqn, state)
    if not isinstance(own, dict) or not isinstance(own.get("optimizer"), dict):
        return own
    return {**own, "optimizer": {**own["optimizer"], "state": states}}


def _is_tensor_marker(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {TENSOR_MARK}


def optimizer_state_without_saved_values(live: Any, saved: Any) -> list[str]:
    """The "fqn/key" of every plain value in the live optimizer state that `saved` does not hold.

    The live values are what torch's get_state_dict probe step created; kept, a parameter would count
    steps from there instead of from the checkpoint.
    """
    saved_states = _optimizer_states(saved)
    missing: list[str] = []
    for fqn, state in _optimizer_states(live).items():
        if not isinstance(state, dict):
            continue
        saved_state = saved_states.get(fqn)
        if not isinstance(saved_state, dict):
            saved_state = {}
        for key, value in state.items():
            if _is_tensor_marker(value):
                continue  # DCP loads it
            # A tensor saved where this optimizer keeps a plain value (AdamW's step, LAMB's int)
            # does not reach it: the overlay would keep the live value.
            if key not in saved_state or _is_tensor_marker(saved_state[key]):
                missing.append(f"{fqn}/{key}")
    return sorted(missing)


def apply_sharded(app_state: Mapping[str, Any], sharded: dict[str, Any]) -> None:
    module, optim = _module_and_optimizer(app_state)
    if module is not None and optim is not None:
        set_state_dict(
            module, optim, model_state_dict=sharded["model"], optim_state_dict=sharded["optimizer"]
        )
        zero = app_state.get("optimizer")
        if isinstance(zero, ZeroRedundancyOptimizer):
            # The LR schedule reads and writes the exposed groups; ZeRO copies them into its partition
            # at each step, so they must carry the restored hyperparameters.
            for exposed, local in zip(zero.param_groups, optim.param_groups, strict=True):
                exposed.update({key: value for key, value in local.items() if key != "params"})
    elif module is not None:
        set_model_state_dict(module, sharded["model"])


def apply_per_rank(app_state: Mapping[str, Any], per_rank: Mapping[str, Any]) -> list[str]:
    """Load every other Stateful; returns the names the checkpoint did not have."""
    missing: list[str] = []
    for name, obj in _per_rank_view(app_state).items():
        if name not in per_rank:
            missing.append(name)
            continue
        obj.load_state_dict(per_rank[name])
    return missing


def tensor_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    total = 0
    for tensor in tensors.values():
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


class StagingArea:
    """CPU copies of the tensors to save, allocated once and reused: a save is one memcpy, no page faults."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def _buffer_for(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(key)
        if buffer is not None and self._matches(buffer, tensor):
            return buffer
        if isinstance(tensor, DTensor):
            # .to keeps mesh and placements; copy=True because .to("cpu") of a CPU tensor is the tensor
            # itself, and the writer would then read weights that later steps change.
            staged = tensor.detach().to("cpu", copy=True)
            assert isinstance(staged, DTensor)
            if torch.cuda.is_available():
                staged._local_tensor = staged.to_local().pin_memory()
            buffer = staged
        else:
            buffer = torch.empty_like(tensor, device="cpu", pin_memory=torch.cuda.is_available())
        self._buffers[key] = buffer
        return buffer

    @staticmethod
    def _matches(buffer: torch.Tensor, tensor: torch.Tensor) -> bool:
        if isinstance(tensor, DTensor) != isinstance(buffer, DTensor):
            return False
        if isinstance(tensor, DTensor) and isinstance(buffer, DTensor):
            same_layout = tensor.placements == buffer.placements and tensor.device_mesh == buffer.device_mesh
            return (
                same_layout
                and buffer.shape == tensor.shape
                and buffer.to_local().shape == tensor.to_local().shape
            )
        return buffer.shape == tensor.shape and buffer.dtype == tensor.dtype

    @torch.no_grad()
    def stage(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        staged: dict[str, torch.Tensor] = {}
        needs_sync = False
        for key, tensor in tensors.items():
            buffer = self._buffer_for(key, tensor)
            source = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            target = buffer.to_local() if isinstance(buffer, DTensor) else buffer
            target.copy_(source.detach(), non_blocking=source.is_cuda)
            needs_sync = needs_sync or source.is_cuda
            staged[key] = buffer
        if needs_sync:
            torch.cuda.synchronize()
        for key in set(self._buffers) - set(tensors):
            del self._buffers[key]
        return staged
