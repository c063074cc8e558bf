"""Resharding: an FSDP checkpoint saved by 4 ranks resumes on 2 and the loss trajectory continues.

The runs use a small training loop of this file, one forked process per rank,
whose global batch does not depend on the world size (the trainer's does), with the same manager calls
as the trainer's loop. Exact resume through the real trainer is in test_checkpoint_cli.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from phalanx_trainer.checkpoint import CheckpointConfig, CheckpointManager
from phalanx_trainer.checkpoint.rng import RngState
from tests.trainer.trainer_harness import run_forked

GLOBAL_BATCH = 8
FEATURES = 16


# --------------------------------------------------------------------------------------------------
# The worker: one rank of a tiny training run.


def _worker(argv: list[str]) -> int:
    torch.set_num_threads(1)  # before any parallel region: forked from a process that imported torch
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--interval", type=int, default=0)
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # same initial weights on every rank
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.1 * s))

    class Progress:
        step = 0

        def state_dict(self) -> dict[str, Any]:
            return {"step": self.step}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.step = int(state["step"])

    progress = Progress()
    state: dict[str, Any] = {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "rng": RngState(),
        "progress": progress,
    }
    config = CheckpointConfig(dir=args.ckpt, interval_steps=args.interval, keep=args.keep)
    manager = CheckpointManager(config)
    start = manager.restore(state) or 0
    assert progress.step == start
    losses = open(f"{args.out}.losses", "a") if rank == 0 else None
    for step in range(start + 1, args.steps + 1):
        generator = torch.Generator().manual_seed(step)  # data position is the step
        inputs = torch.randn(GLOBAL_BATCH, FEATURES, generator=generator)
        targets = torch.randn(GLOBAL_BATCH, 1, generator=generator)
        per_rank = GLOBAL_BATCH // world  # the global batch is the same whatever the world size
        inputs = inputs[rank * per_rank : (rank + 1) * per_rank]
        targets = targets[rank * per_rank : (rank + 1) * per_rank]
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        progress.step = step
        reported = loss.detach().clone()
        dist.all_reduce(reported)
        reported /= world
        if losses is not None:
            losses.write(json.dumps({"step": step, "loss": float(reported).hex()}) + "\n")
            losses.flush()
        if manager.should_save(step):
            manager.save(step, state)
    manager.save(args.steps, state)
    manager.close()
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------------------------------
# The harness.


def _rank_main(rank: int, world: int, port: int, log: str, args: tuple[str, ...]) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
    )
    with open(log, "wb") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    sys.exit(_worker(list(args)))


def _run(world: int, *args: str) -> None:
    """One rank per forked process: torch is imported once, here, not once per rank."""
    logs = [f"{args[args.index('--out') + 1]}.rank{rank}.log" for rank in range(world)]
    codes = run_forked(world, _rank_main, lambda rank, port: (rank, world, port, logs[rank], args))
    output = "\n".join(
        f"--- rank {i} ---\n{Path(log).read_text(errors='replace')[-3000:]}" for i, log in enumerate(logs)
    )
    assert codes == [0] * world, output


def _losses(out: Path) -> dict[int, float]:
    path = Path(f"{out}.losses")
    if not path.exists():
        return {}
    result: dict[int, float] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            result[int(record["step"])] = float.fromhex(record["loss"])
    return result


# --------------------------------------------------------------------------------------------------
# The tests.

TOTAL_STEPS = 10


@pytest.mark.trainer
def test_fsdp_checkpoint_saved_on_four_ranks_resumes_on_two(tmp_path: Path) -> None:
    saved_at = 4
    ckpt, wide = tmp_path / "ckpt", tmp_path / "wide"
    common = ["--steps", str(TOTAL_STEPS), "--ckpt", str(ckpt)]
    _run(4, *common, "--interval", str(saved_at), "--keep", "10", "--out", str(wide))
    newer = [path for path in ckpt.glob("step-*") if int(path.name.removeprefix("step-")) > saved_at]
    assert newer, "the 4-rank run should have committed checkpoints after the one resumed from"
    for path in newer:
        shutil.rmtree(path)
    narrow = tmp_path / "narrow"
    _run(2, *common, "--out", str(narrow))
    expected, continued = _losses(wide), _losses(narrow)
    assert sorted(continued) == list(range(saved_at + 1, TOTAL_STEPS + 1))
    worst = max(abs(continued[s] - expected[s]) / abs(expected[s]) for s in continued)
    # Only the order of floating-point sums differs (4 shards vs 2): documented tolerance 1e-5 relative.
    assert worst <= 1e-5, f"relative loss difference {worst:.3g} after resharding 4 -> 2"
    print(f"reshard 4 -> 2: largest relative loss difference {worst:.3g}")
