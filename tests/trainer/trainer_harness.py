"""Runs the real Trainer in forked gloo processes and records losses and full gradients.

Each group of ranks runs several layouts one after another in the same processes, and the ranks are
forked from the test process, which has imported torch already (starting Python and importing torch
costs more than the tiny runs themselves on a 2-core machine).
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from phalanx.ports import free_port
from phalanx_trainer.config import DataConfig, ModelConfig, load_config
from phalanx_trainer.dataset import SyntheticSource
from phalanx_trainer.distenv import DistEnv
from phalanx_trainer.logs import EventLog
from phalanx_trainer.train import Trainer

# A tiny GPT on the shipped text: 2 blocks, d=32, 4 heads, 16 tokens; 8 sequences per global batch.
TINY = [
    "job.torch_threads=1",
    "job.steps=3",
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.seq_len=16",
    "optimizer.lr=0.003",
    "schedule.kind=constant",
    "metrics.port=0",
    "checkpoint.dir=''",
]
GLOBAL_BATCH = 8
COLLECTIVE_TIMEOUT_S = 120


def _clean(name: str) -> str:
    return name.replace("_orig_mod.", "").replace("module.", "")


def full_gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient, gathered over shards and (all ranks) over pipeline stages."""
    local: dict[str, torch.Tensor] = {}
    for name, param in trainer.model.named_parameters():
        if param.grad is None:
            continue
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        local[_clean(name)] = grad.detach().clone()
    if not dist.is_initialized():
        return local
    gathered: list[dict[str, torch.Tensor] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    merged: dict[str, torch.Tensor] = {}
    for part in gathered:
        merged.update(part or {})
    return merged


def alias_groups(model: torch.nn.Module) -> list[list[str]]:
    """Names that share one parameter object (tied weights), each group in registration order."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(_clean(name))
    return [names for names in by_id.values() if len(names) > 1]


def gathered_objects(value: Any) -> list[Any]:
    """`value` from every rank, in rank order (just this one without a process group)."""
    if not dist.is_initialized():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


@contextlib.contextmanager
def counting_reduce_scatters() -> Iterator[list[int]]:
    """Counts this rank's reduce-scatters (FSDP2 reduces gradients with dist.reduce_scatter_single)."""
    counted = [0]
    original = dist.reduce_scatter_single

    def counting(*args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return original(*args, **kwargs)

    dist.reduce_scatter_single = counting  # type: ignore[assignment]
    try:
        yield counted
    finally:
        dist.reduce_scatter_single = original  # type: ignore[assignment]


@contextlib.contextmanager
def recording_linear_dtypes(model: torch.nn.Module) -> Iterator[dict[str, set[str]]]:
    """The dtypes every nn.Linear saw in forward: its weight as used (FSDP's gathered copy) and output."""
    seen: dict[str, set[str]] = {"weight": set(), "output": set()}

    def record(module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        seen["weight"].add(str(module.weight.dtype).removeprefix("torch."))
        seen["output"].add(str(output.dtype).removeprefix("torch."))

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def recording_local_shapes(model: torch.nn.Module) -> Iterator[dict[str, list[int]]]:
    """This rank's local output shape of the whole model (the logits) and of its first block."""
    shapes: dict[str, list[int]] = {}
    modules = {_clean(name) or "<root>": module for name, module in model.named_modules()}
    handles = []
    for name in ("<root>", "layers.0"):
        if name not in modules:
            continue

        def record(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor, name: str = name) -> None:
            local = output.to_local() if isinstance(output, DTensor) else output
            shapes.setdefault(name, list(local.shape))

        handles.append(modules[name].register_forward_hook(record))
    try:
        yield shapes
    finally:
        for handle in handles:
            handle.remove()


def fsdp_unit_names(model: torch.nn.Module) -> list[str]:
    from torch.distributed.fsdp import FSDPModule

    return [_clean(name) or "<root>" for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def constant_stride_source(data: DataConfig, model: ModelConfig) -> SyntheticSource:
    """A `data.custom` hook for the tests: sequences counting up by one."""

    class CountingSource(SyntheticSource):
        def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            start = index % self.vocab_size
            window = (start + torch.arange(self.seq_len + 1)) % self.vocab_size
            return window[:-1], window[1:]

    return CountingSource(model.vocab_size, model.seq_len, seed=0)


def run_trainer(
    overrides: list[str], world_size: int, rank: int, steps: int, full_loop: bool = False
) -> dict[str, Any]:
    """Builds the Trainer and runs `steps` steps (or its whole `train()` loop with full_loop)."""
    config = load_config(None, TINY + overrides + [f"job.steps={steps}"], world_size)
    env = DistEnv(rank, rank, world_size, 1, 0, world_size, "127.0.0.1", 0, 0, 60.0)
    trainer = Trainer(config, env, log=EventLog(rank=1))  # quiet
    if full_loop:
        code = trainer.train()
        trainer.close()
        return {"exit_code": code}
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    reduce_scatters = 0
    linear_dtypes: dict[str, set[str]] = {}
    first_local_shapes: dict[str, list[int]] = {}
    grad_dtypes: set[str] = set()
    for step in range(steps):
        with (
            counting_reduce_scatters() as counted,
            recording_linear_dtypes(trainer.model) as seen,
            recording_local_shapes(trainer.model) as local_shapes,
        ):
            local_loss = trainer.forward_backward()
        if step == 0:
            grads = full_gradients(trainer)
            reduce_scatters = counted[0]
            linear_dtypes = seen
            first_local_shapes = local_shapes
            grad_dtypes = {
                str(p.grad.dtype).removeprefix("torch.") for p in trainer.params if p.grad is not None
            }
        losses.append(trainer.reduce_loss(local_loss))
        trainer.optimizer_step()
    trainer.close()
    return {
        "losses": losses,
        "grads": grads,
        "reduce_scatters": reduce_scatters,
        "linear_dtypes": linear_dtypes,
        "grad_dtypes": grad_dtypes,
        "fsdp_units": fsdp_unit_names(trainer.model),
        "alias_groups": alias_groups(trainer.model),
        "local_shapes": first_local_shapes,
        "local_shapes_by_rank": gathered_objects(first_local_shapes),
        "loss_scale": trainer.scaler.scale,
        "skipped": trainer.scaler.skipped_steps,
    }


def _worker(
    rank: int, world_size: int, port: int, layouts: dict[str, list[str]], steps: int, out: str
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    # A layout that fails on one rank only leaves the others in a collective: fail them within
    # minutes rather than at pytest's timeout, with the failing rank's traceback in the results.
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    results: dict[str, Any] = {}
    for name, overrides in layouts.items():
        try:
            results[name] = run_trainer(overrides, world_size, rank, steps)
        except Exception:  # recorded per layout so one broken layout does not hide the others
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    if rank == 0:
        torch.save(results, Path(out) / "results.pt")
    dist.destroy_process_group()


def run_ranks(layouts: dict[str, list[str]], world_size: int, steps: int) -> dict[str, Any]:
    """Runs every layout on `world_size` forked ranks; returns rank 0's results by layout name."""
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _worker,
            args=(world_size, free_port(), layouts, steps, out),
            nprocs=world_size,
            start_method="fork",
        )
        results: dict[str, Any] = torch.load(Path(out) / "results.pt", weights_only=False)
    return results


# Per-tensor norms below this fraction of the largest tensor's norm count as zero: the attention key
# bias's gradient is zero in exact arithmetic (softmax ignores a constant shift) and measures 2e-11
# in fp32, 4e-7 in bf16, three decades below the smallest real gradient (the query bias, 3e-4).
ZERO_GRADIENT_FLOOR = 1e-4


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest ||a - b|| / ||b|| over the gradient tensors, ||b|| floored at ZERO_GRADIENT_FLOOR
    of the largest tensor's norm.

    Per tensor, so a small tensor (a LayerNorm, the q/k biases) that is wrong fails even when the
    model's largest gradient dwarfs it; the floor keeps numerically zero gradients from turning
    rounding noise into a 100% error.
    """
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    norms = {name: float(reference.float().norm()) for name, reference in b.items()}
    floor = ZERO_GRADIENT_FLOOR * max(norms.values())
    if floor == 0.0:
        return max(float((a[name].float()).abs().max()) for name in b)
    return max(float((a[name].float() - b[name].float()).norm()) / max(norms[name], floor) for name in b)


def run_forked(
    world: int,
    target: Callable[..., None],
    args_for: Callable[[int, int], tuple[Any, ...]],
    timeout: float = 150,
) -> list[int | None]:
    """One forked process per rank running target(*args_for(rank, port)), all given the same free
    port; joined, any still up after `timeout` killed. Returns their exit codes. Forked, so torch is
    imported once, here, not once per rank."""
    context = multiprocessing.get_context("fork")
    port = free_port()
    procs = [context.Process(target=target, args=args_for(rank, port)) for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    return [proc.exitcode for proc in procs]
