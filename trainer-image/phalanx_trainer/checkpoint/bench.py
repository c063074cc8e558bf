"""Checkpoint benchmark (not a test): `python -m phalanx_trainer.checkpoint.bench` (make bench-checkpoint).

A model plus AdamW state of about 1 GB on CPU. Each repetition measures, interleaved: a plain copy of
the state into preallocated memory (the floor for staging), the same bytes written sequentially to one
file on the same disk and fsynced, a synchronous save, and an asynchronous save during which training
goes on. Figures are medians over the repetitions; results go to bench/results/checkpoint.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from phalanx_trainer.checkpoint.manager import CheckpointManager
from phalanx_trainer.checkpoint.records import CheckpointConfig
from phalanx_trainer.checkpoint.state import collect, split_tensors, tensor_bytes

GOALS = {"blocking_vs_memcpy": 1.5, "write_throughput_ratio_vs_raw": 0.8, "step_slowdown_during_save": 1.1}


def build(width: int, layers: int, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, optimizer


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    began = time.perf_counter()
    loss = model(batch).square().mean()
    optimizer.zero_grad(set_to_none=False)
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    if batch.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - began


def state_tensors(app_state: dict[str, Any]) -> dict[str, torch.Tensor]:
    sharded, _ = collect(app_state)
    return split_tensors(sharded)[1]


def measure_memcpy(tensors: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> float:
    began = time.perf_counter()
    for key, tensor in tensors.items():
        buffers[key].copy_(tensor, non_blocking=tensor.is_cuda)
    if any(t.is_cuda for t in tensors.values()):
        torch.cuda.synchronize()
    return time.perf_counter() - began


def measure_raw_write(buffers: dict[str, torch.Tensor], folder: Path) -> float:
    path = folder / "raw.bin"
    began = time.perf_counter()
    with open(path, "wb", buffering=0) as handle:
        for buffer in buffers.values():
            handle.write(buffer.reshape(-1).view(torch.uint8).numpy().data)
        os.fsync(handle.fileno())
    elapsed = time.perf_counter() - began
    path.unlink()
    return elapsed


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    model, optimizer = build(args.width, args.layers, device)
    batch = torch.randn(args.batch, args.width, device=device)
    train_step(model, optimizer, batch)  # optimizer state exists from here on
    app_state: dict[str, Any] = {"model": model, "optimizer": optimizer}
    tensors = state_tensors(app_state)
    state_bytes = tensor_bytes(tensors)
    buffers = {
        k: torch.empty_like(t, device="cpu", pin_memory=device.type == "cuda") for k, t in tensors.items()
    }
    work = Path(tempfile.mkdtemp(prefix="phalanx-ckpt-bench-", dir=args.dir))
    sync_manager = CheckpointManager(CheckpointConfig(dir=str(work / "sync"), async_save=False, keep=2))
    async_manager = CheckpointManager(
        CheckpointConfig(dir=str(work / "async"), async_save=True, keep=2),
        writer_nice_increment=args.writer_nice,
    )
    # Warm-up: first-touch of staging buffers and of the page cache paths is not what we measure.
    measure_memcpy(tensors, buffers)
    sync_manager.save(0, app_state)
    async_manager.save(0, app_state)
    async_manager.wait()

    samples: dict[str, list[float]] = {
        k: []
        for k in (
            "memcpy_seconds",
            "raw_write_seconds",
            "sync_save_seconds",
            "sync_write_seconds",
            "async_blocking_seconds",
            "async_total_seconds",
            "step_seconds",
            "step_seconds_during_save",
        )
    }
    for repetition in range(1, args.repetitions + 1):
        samples["memcpy_seconds"].append(measure_memcpy(tensors, buffers))
        samples["raw_write_seconds"].append(measure_raw_write(buffers, work))
        began = time.perf_counter()
        sync_manager.save(repetition, app_state)
        samples["sync_save_seconds"].append(time.perf_counter() - began)
        assert sync_manager.last_save is not None
        samples["sync_write_seconds"].append(
            sync_manager.last_save.total_seconds - sync_manager.last_save.blocking_seconds
        )

        normal = [train_step(model, optimizer, batch) for _ in range(args.steps)]
        began = time.perf_counter()
        async_manager.save(repetition, app_state)
        samples["async_blocking_seconds"].append(time.perf_counter() - began)
        during: list[float] = []
        while async_manager._writer.busy:  # noqa: SLF001 - the benchmark watches the writer on purpose
            during.append(train_step(model, optimizer, batch))
        async_manager.wait()
        assert async_manager.last_save is not None
        samples["async_total_seconds"].append(async_manager.last_save.total_seconds)
        samples["step_seconds"].append(statistics.median(normal))
        # The step that overlapped the end of the save counts too: it was slowed as much as any.
        samples["step_seconds_during_save"].append(statistics.median(during) if during else float("nan"))
        print(
            f"rep {repetition}: memcpy {samples['memcpy_seconds'][-1]:.3f}s raw {samples['raw_write_seconds'][-1]:.2f}s "
            f"sync {samples['sync_save_seconds'][-1]:.2f}s async blocking {samples['async_blocking_seconds'][-1]:.3f}s "
            f"total {samples['async_total_seconds'][-1]:.2f}s steps {statistics.median(normal):.3f}s "
            f"-> {samples['step_seconds_during_save'][-1]:.3f}s during ({len(during)} steps)",
            flush=True,
        )
    shutil.rmtree(work, ignore_errors=True)

    median = {key: statistics.median(values) for key, values in samples.items()}
    result: dict[str, Any] = {
        "state_bytes": state_bytes,
        "device": str(device),
        "repetitions": args.repetitions,
        "memcpy_seconds": median["memcpy_seconds"],
        "sync_save_seconds": median["sync_save_seconds"],
        "async_blocking_seconds": median["async_blocking_seconds"],
        "async_total_seconds": median["async_total_seconds"],
        "blocking_vs_memcpy": median["async_blocking_seconds"] / median["memcpy_seconds"],
        "raw_write_seconds": median["raw_write_seconds"],
        # Our write path (DCP files, fsync, SHA-256 of every file, manifest, rename) against raw bytes.
        "write_throughput_ratio_vs_raw": median["raw_write_seconds"] / median["sync_write_seconds"],
        "step_seconds": median["step_seconds"],
        "step_seconds_during_save": median["step_seconds_during_save"],
        "step_slowdown_during_save": median["step_seconds_during_save"] / median["step_seconds"],
        "async_blocking_vs_sync_save": median["async_blocking_seconds"] / median["sync_save_seconds"],
        "samples": samples,
        "goals": GOALS,
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()},
        "config": vars(args),
    }
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=5)  # 5 x 4096^2 fp32 = 336 MB weights; AdamW x3 = 1 GB
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="normal steps timed before each async save")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--writer-nice", type=int, default=10, help="niceness added to the writer thread")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: the temp dir)")
    parser.add_argument("--out", default="bench/results/checkpoint.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    summary = {
        k: round(v, 4) if isinstance(v, float) else v for k, v in result.items() if k not in ("samples",)
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
