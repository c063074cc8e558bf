"""The check for the day a GPU machine is lent: NCCL works and how fast, and one bf16 FSDP run of the
125M GPT with its MFU. One process per visible GPU; well within 5 minutes on one H200.

1. NCCL all-reduce: correctness (a sum of rank ids), then the bus bandwidth of a 256 MiB fp32
   all-reduce (nccl-tests' busbw: algorithm bandwidth x 2(n-1)/n; 0 with one GPU, where no byte
   crosses a link, so the check then shows only that NCCL runs).
2. configs/gpt-125m-gpu.toml (bf16, FSDP), real Trainer: warm-up steps, then timed steps; tokens/s
   from the wall time between step starts and MFU against the device's peak from
   phalanx_trainer.hardware (the same figures the trainer's metrics report).
3. Writes bench/results/gpu.json.

    make gpu-check                                   # on the GPU machine
    python bench/gpu_check.py --dry-run --out /tmp/gpu.json   # CPU, gloo, tiny model (the tests run this)

The dry run must name --out: it never writes bench/results/gpu.json, whose figures are a GPU's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from phalanx.ports import free_port
from phalanx_trainer.config import load_config
from phalanx_trainer.distenv import DistEnv, process_group_backend
from phalanx_trainer.logs import EventLog
from phalanx_trainer.metrics import mfu, seconds_per_step_between
from phalanx_trainer.train import Trainer

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "results" / "gpu.json"
CONFIG = REPO / "trainer-image" / "phalanx_trainer" / "configs" / "gpt-125m-gpu.toml"
# Everything the check changes in the shipped config: no checkpoints, no metrics server, no
# progress lines of the trainer's own (the check prints its own).
RUN_OVERRIDES = ["checkpoint.dir=''", "metrics.port=0", "metrics.log_every=1000000"]
DRY_RUN_OVERRIDES = [
    "job.device=cpu",
    "job.torch_threads=1",
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.seq_len=16",
    "data.batch_size=2",
    "data.num_workers=0",
    "data.pin_memory=false",
    "data.persistent_workers=false",
]


def say(rank: int, message: str) -> None:
    if rank == 0:
        stamp = datetime.datetime.now().strftime("%H:%M:%S")
        print(f"[gpu-check {stamp}] {message}", flush=True)


def bus_bandwidth(bytes_moved: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algorithm, bus) bandwidth in GB/s of one all-reduce, as nccl-tests reports them."""
    algorithm = bytes_moved / seconds / 1e9
    return algorithm, algorithm * 2 * (world_size - 1) / world_size


def check_all_reduce(rank: int, world_size: int, device: torch.device, megabytes: int) -> dict[str, Any]:
    probe = torch.full((4,), float(rank), device=device)
    dist.all_reduce(probe)
    expected = float(sum(range(world_size)))
    correct = bool(torch.all(probe == expected).item())
    payload = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    for _ in range(3):  # warm-up: communicator set-up and the first kernels
        dist.all_reduce(payload)
    iterations = 10
    synchronize(device)
    dist.barrier()
    began = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(payload)
    synchronize(device)
    seconds = (time.perf_counter() - began) / iterations
    algorithm, bus = bus_bandwidth(payload.numel() * 4, seconds, world_size)
    say(
        rank, f"all-reduce {megabytes} MiB x {world_size} ranks: {seconds * 1e3:.2f} ms, busbw {bus:.1f} GB/s"
    )
    return {
        "correct": correct,
        "bytes": payload.numel() * 4,
        "seconds": seconds,
        "algbw_gbps": algorithm,
        "busbw_gbps": bus,
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_fsdp(rank: int, world_size: int, dry_run: bool, warmup: int, steps: int) -> dict[str, Any]:
    overrides = [*RUN_OVERRIDES, f"job.steps={warmup + steps}"]
    if dry_run:
        dtype = "bf16" if cpu_runs_bf16() else "fp32"
        overrides += [*DRY_RUN_OVERRIDES, f"precision.dtype={dtype}"]
    config = load_config(CONFIG, overrides, world_size)
    env = DistEnv(rank, rank, world_size, 1, 0, world_size, "127.0.0.1", 0, 0, 60.0)
    trainer = Trainer(config, env, log=EventLog(rank=1))  # quiet: the check prints its own lines
    parameters = sum(p.numel() for p in trainer.model.parameters())  # DTensor.numel(): the whole tensor
    say(
        rank,
        f"model built: {parameters:,} parameters, {config.precision.dtype},"
        f" dp_mode {config.parallelism.dp_mode} over {world_size} ranks",
    )
    starts: list[float] = []
    losses: list[float] = []
    for step in range(1, warmup + steps + 1):
        if step > warmup:
            starts.append(time.perf_counter())
        local_loss, _report = trainer.train_step()
        losses.append(trainer.reduce_loss(local_loss))  # a sync point, as the loop's own logging is
        say(
            rank,
            f"step {step}/{warmup + steps}{' (warm-up)' if step <= warmup else ''}: loss {losses[-1]:.4f}",
        )
    synchronize(trainer.device)
    starts.append(time.perf_counter())  # the end of the last timed step
    seconds_per_step = seconds_per_step_between(starts) or float("nan")
    tokens_per_second = trainer.tokens_per_step / seconds_per_step
    utilisation = mfu(trainer.flops_per_token, tokens_per_second, trainer.peak_flops, world_size)
    memory_peak = torch.cuda.max_memory_allocated(trainer.device) if trainer.device.type == "cuda" else 0
    say(
        rank,
        f"{seconds_per_step * 1e3:.1f} ms/step, {tokens_per_second:,.0f} tokens/s, MFU {utilisation:.1%}"
        f" (peak {trainer.peak_flops / 1e12:.0f} TFLOP/s per device)",
    )
    trainer.close()
    return {
        "config": str(CONFIG.relative_to(REPO)),
        "overrides": overrides,
        "warmup_steps": warmup,
        "timed_steps": steps,
        "tokens_per_step": trainer.tokens_per_step,
        "seconds_per_step": seconds_per_step,
        "tokens_per_second": tokens_per_second,
        "flops_per_token": trainer.flops_per_token,
        "peak_flops_per_device": trainer.peak_flops,
        "mfu": utilisation,
        "losses": losses,
        "memory_peak_bytes": memory_peak,
    }


def cpu_runs_bf16() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    except RuntimeError:
        return False


def process_group_backend_for(dry_run: bool) -> str:
    """The trainer's own backend choice: on GPUs gloo serves the CPU tensors it reduces too."""
    return process_group_backend(use_cuda=not dry_run)


def worker(rank: int, world_size: int, port: int, args: argparse.Namespace, scratch: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = datetime.timedelta(seconds=120)
    backend = process_group_backend_for(args.dry_run)
    if args.dry_run:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        device = torch.device("cpu")
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    else:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, device_id=device)
    say(rank, f"{backend} process group up: {world_size} ranks")
    result = {"all_reduce": check_all_reduce(rank, world_size, device, args.all_reduce_mib)}
    result["fsdp"] = run_fsdp(rank, world_size, args.dry_run, args.warmup, args.steps)
    if rank == 0:
        Path(scratch, "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, 2 ranks, a tiny model")
    parser.add_argument("--out", type=Path, default=None, help=f"result file (default {DEFAULT_OUT})")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (GPU 5, dry run 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (GPU 20, dry run 2)")
    parser.add_argument("--all-reduce-mib", type=int, default=None, help="payload (GPU 256, dry run 1)")
    args = parser.parse_args(argv)
    if args.dry_run and args.out is None:
        parser.error("--dry-run needs --out: bench/results/gpu.json holds a GPU's figures only")
    if args.out is None:
        args.out = DEFAULT_OUT
    if args.dry_run and args.out.resolve() == DEFAULT_OUT.resolve():
        parser.error("--dry-run must not write bench/results/gpu.json: pass another --out")
    args.warmup = args.warmup if args.warmup is not None else (1 if args.dry_run else 5)
    args.steps = args.steps if args.steps is not None else (2 if args.dry_run else 20)
    args.all_reduce_mib = (
        args.all_reduce_mib if args.all_reduce_mib is not None else (1 if args.dry_run else 256)
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        world_size, device_name = 2, "cpu (dry run)"
    else:
        if not torch.cuda.is_available():
            print(
                "gpu-check: no CUDA device here; `--dry-run --out PATH` checks the script on CPU",
                file=sys.stderr,
            )
            return 2
        world_size, device_name = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    began = time.perf_counter()
    print(f"[gpu-check] {world_size} x {device_name}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        mp.start_processes(
            worker,
            args=(world_size, free_port(), args, scratch),
            nprocs=world_size,
            start_method="fork" if args.dry_run else "spawn",
        )
        result = json.loads(Path(scratch, "result.json").read_text())
    document = {
        "dry_run": args.dry_run,
        "device": device_name,
        "world_size": world_size,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        "host": platform.node(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_seconds": time.perf_counter() - began,
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"[gpu-check] wrote {args.out} in {document['wall_seconds']:.0f} s", flush=True)
    return 0 if result["all_reduce"]["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
