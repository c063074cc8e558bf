"""Resharding: an FSDP checkpoint saved by 4 ranks resumes on 2 and the loss trajectory continues.

The runs use a small training loop of this file (run as a script: `python <this file> worker ...`)
whose global batch does not depend on the world size (the trainer's does), with the same manager calls
as the trainer's loop. Exact resume through the real trainer is in test_checkpoint_cli.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINER_SRC = REPO / "trainer-image"
GLOBAL_BATCH = 8
FEATURES = 16
EXIT_CHECKPOINTED_ON_PREEMPTION = 75


# --------------------------------------------------------------------------------------------------
# The worker: one rank of a tiny training run.


def _worker(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from phalanx_trainer.checkpoint import CheckpointConfig, CheckpointManager, PreemptionWatcher
    from phalanx_trainer.checkpoint.rng import RngState

    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", choices=["ddp", "fsdp", "tp"], required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--ckpt", default="")
    parser.add_argument("--interval", type=int, default=0)
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # same initial weights on every rank
    model: nn.Module = nn.Sequential(
        nn.Linear(FEATURES, 32),
        nn.ReLU(),
        nn.Dropout(args.dropout),
        nn.Linear(32, 32),
        nn.Tanh(),
        nn.Linear(32, 1),
    )
    split_batch = True
    if args.layout == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif args.layout == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for index in (0, 3, 5):
            fully_shard(model[index], mesh=mesh)  # type: ignore[index]
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "3": RowwiseParallel()})
        split_batch = False  # every TP rank sees the whole batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.1 * s))
    torch.manual_seed(1000 + rank)  # each rank its own dropout stream, which the checkpoint must restore

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
    config = CheckpointConfig(
        dir=args.ckpt, interval_steps=args.interval, keep=args.keep, emergency_budget_seconds=args.budget
    )
    manager = CheckpointManager(config)
    start = manager.restore(state) or 0
    assert progress.step == start
    watcher = PreemptionWatcher()
    watcher.install()
    losses = open(f"{args.out}.losses", "a") if rank == 0 else None
    for step in range(start + 1, args.steps + 1):
        generator = torch.Generator().manual_seed(step)  # data position is the step
        inputs = torch.randn(GLOBAL_BATCH, FEATURES, generator=generator)
        targets = torch.randn(GLOBAL_BATCH, 1, generator=generator)
        if split_batch:
            per_rank = GLOBAL_BATCH // world
            inputs = inputs[rank * per_rank : (rank + 1) * per_rank]
            targets = targets[rank * per_rank : (rank + 1) * per_rank]
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        progress.step = step
        reported = loss.detach().clone()
        if split_batch:
            dist.all_reduce(reported)
            reported /= world
        if losses is not None:
            losses.write(json.dumps({"step": step, "loss": float(reported).hex()}) + "\n")
            losses.flush()
        if manager.should_save(step):
            manager.save(step, state)
        if watcher.agreed_stop():
            manager.save(step, state, emergency=True)
            manager.wait()
            return EXIT_CHECKPOINTED_ON_PREEMPTION
        time.sleep(args.step_sleep)
    if manager.enabled:
        manager.save(args.steps, state)
        manager.close()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, f"{args.out}.weights.pt")
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------------------------------
# The harness.


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(world: int, *args: str) -> list[subprocess.Popen[bytes]]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(p for p in (str(TRAINER_SRC), env.get("PYTHONPATH", "")) if p),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "worker", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def _finish(procs: list[subprocess.Popen[bytes]], timeout: float = 150.0) -> list[int]:
    codes = []
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        codes.append(proc.returncode)
    return codes


def _output(procs: list[subprocess.Popen[bytes]]) -> str:
    return "\n".join(
        f"--- rank {i} ---\n" + (p.stdout.read().decode(errors="replace")[-3000:] if p.stdout else "")
        for i, p in enumerate(procs)
    )


def _run(world: int, *args: str) -> None:
    procs = _launch(world, *args)
    codes = _finish(procs)
    assert codes == [0] * world, _output(procs)


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
    common = ["--layout", "fsdp", "--steps", str(TOTAL_STEPS), "--ckpt", str(ckpt), "--dropout", "0"]
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


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(_worker(sys.argv[2:]))
