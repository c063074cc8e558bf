"""A plain PyTorch DDP script for `torchrun train.py`, with nothing Phalanx-specific in it.

What it must do to survive a restart in place (docs/torchrun.md): save a checkpoint now and then,
and on every start resume from the newest one. torchrun restarts the workers of every pod of the
gang when one pod is lost or one worker dies; the new workers run this script from the top.

    torchrun --nnodes=1 --nproc-per-node=2 train.py --steps 200 --checkpoint-dir /tmp/ckpt

The data of a step depends only on the step and the rank, so a resumed run computes the same
losses as one that was never interrupted.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

PROCESS_STARTED = time.time()  # before `import torch`: the start-up log line splits the restart time

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

FEATURES = 16
BATCH = 32


def parse_args() -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1234)
    # Phalanx sets these variables in every pod; the flags win when given.
    parser.add_argument("--checkpoint-dir", default=env("PHALANX_CHECKPOINT_DIR", "checkpoints"))
    parser.add_argument(
        "--checkpoint-every", type=int, default=int(env("PHALANX_CHECKPOINT_INTERVAL_STEPS", "20"))
    )
    parser.add_argument("--keep", type=int, default=int(env("PHALANX_CHECKPOINT_KEEP", "3")))
    # A dead peer that never closes its sockets (a lost node) hangs a collective until this timeout:
    # torch's default is 10-30 minutes, far longer than a restart in place should take.
    parser.add_argument(
        "--collective-timeout", type=float, default=float(env("PHALANX_COLLECTIVE_TIMEOUT_SECONDS", "60"))
    )
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="extra time per step (a stand-in for work)"
    )
    return parser.parse_args()


def batch_for(step: int, rank: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(BATCH, FEATURES, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x.to(device), y.to(device)


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.pt"


def saved_steps(directory: Path) -> list[int]:
    steps = []
    for path in directory.glob("step-*.pt"):
        try:
            steps.append(int(path.stem.removeprefix("step-")))
        except ValueError:
            continue
    return sorted(steps)


def save_checkpoint(
    directory: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, keep: int
) -> None:
    """Write to a temporary name, fsync, then rename: a reader never sees half a checkpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step)
    partial = final.with_suffix(".pt.partial")
    with open(partial, "wb") as out:
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, final)
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)
    for old in saved_steps(directory)[:-keep]:
        checkpoint_path(directory, old).unlink(missing_ok=True)


def newest_loadable_step(directory: Path) -> int:
    """The newest checkpoint that loads (0: none); a damaged one falls back to the one before it."""
    for step in reversed(saved_steps(directory)):
        try:
            torch.load(checkpoint_path(directory, step), map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - any unreadable file means "try the older one"
            print(f"checkpoint step {step} unreadable ({error}), trying the previous one", flush=True)
            continue
        return step
    return 0


def resume_step(directory: Path, rank: int, device: torch.device) -> int:
    """Rank 0 chooses the checkpoint and tells the others, so that every rank resumes at one step."""
    chosen = torch.tensor([newest_loadable_step(directory) if rank == 0 else 0], device=device)
    dist.broadcast(chosen, src=0)
    return int(chosen.item())


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo", timeout=timedelta(seconds=args.collective_timeout)
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    print(
        f"worker rank {rank}/{world} group_rank {os.environ.get('GROUP_RANK', '0')} "
        f"restart_count {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')} pid {os.getpid()} "
        f"started {PROCESS_STARTED:.3f} ready {time.time():.3f}",
        flush=True,
    )

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    directory = Path(args.checkpoint_dir)

    start = resume_step(directory, rank, device)
    if start:
        state = torch.load(checkpoint_path(directory, start), map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    if rank == 0:
        print(f"resumed from step {start}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    loss_fn = nn.MSELoss()

    for step in range(start + 1, args.steps + 1):
        x, y = batch_for(step, rank, args.seed, device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()  # DDP averages the gradients over all ranks here
        optimizer.step()
        if args.step_seconds:
            time.sleep(args.step_seconds)

        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= world
        if rank == 0:
            print(f"step {step} loss {mean_loss.item():.6f} time {time.time():.3f}", flush=True)
            if step % args.checkpoint_every == 0 or step == args.steps:
                save_checkpoint(directory, step, model, optimizer, args.keep)

    # Leave together: every rank waits for rank 0's last checkpoint, and DDP (which holds the group)
    # goes before the group. A rank that tore its group down while a peer still used it has been seen
    # to abort at exit ("terminate called without an active exception", -6), which the agent counts
    # as a failure and answers with a restart the finished peer never joins.
    dist.barrier()
    del ddp
    dist.destroy_process_group()
    # And leave at once: even after the above, gloo's threads have aborted the interpreter's exit
    # now and then (-6, which the agent counts as a failure). Output is flushed; nothing is left.
    os._exit(0)


if __name__ == "__main__":
    main()
