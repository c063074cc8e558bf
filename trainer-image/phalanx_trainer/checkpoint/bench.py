"""Checkpoint benchmark (not a test): `python -m phalanx_trainer.checkpoint.bench` (make bench-checkpoint).

A model plus AdamW state of about 1 GB on CPU. Each repetition runs three phases, and their order
rotates from one repetition to the next (raw, sync, async; then sync, async, raw; ...), so that no
side always runs first on a warm disk or last on a tired one:

- raw: the staged bytes written to the same disk and fsynced, as many files by as many threads as a
  save writes per rank (the floor for a save), then read back cold the same way (the floor for a
  restore);
- sync: a synchronous save, then a restore of it into the live state, read cold;
- async: an asynchronous save while training goes on until it commits.

"Cold": after each fsync the benchmark drops the files' pages from the page cache
(posix_fadvise DONTNEED on clean pages, no root needed), so both reads come from the disk.
A plain copy of the state into preallocated memory (the floor for staging) is measured in each
repetition too. Times are medians over the repetitions, with the spread (min-max); each goal's ratio
is taken within each repetition and reported as the median of those pairs, with their spread.
Results go to bench/results/checkpoint.json.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import nn

from phalanx_trainer.checkpoint.manager import CheckpointManager
from phalanx_trainer.checkpoint.records import CheckpointConfig
from phalanx_trainer.checkpoint.state import collect, split_tensors, tensor_bytes

# name -> (bound, "max" when the figure must stay at or below it, "min" when at or above it)
GOALS: dict[str, tuple[float, str]] = {
    "blocking_vs_memcpy": (1.5, "max"),
    "write_throughput_ratio_vs_raw": (0.8, "min"),
    "restore_throughput_ratio_vs_raw_read": (0.7, "min"),
    "step_slowdown_during_save": (1.1, "max"),
    "async_total_vs_sync_save": (2.0, "max"),
}
PHASES = ("raw", "sync", "async")


def phase_order(repetition: int) -> tuple[str, ...]:
    """The phases of one repetition: a rotation, so each phase runs first, second and third in turn."""
    shift = repetition % len(PHASES)
    return PHASES[shift:] + PHASES[:shift]


def drop_cache(paths: list[Path]) -> None:
    """Evict these files' (clean, fsynced) pages so the next read comes from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


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


def split_buffers(buffers: dict[str, torch.Tensor], streams: int) -> list[list[torch.Tensor]]:
    """The buffers dealt into `streams` groups of about equal bytes, largest first."""
    groups: list[list[torch.Tensor]] = [[] for _ in range(streams)]
    sizes = [0] * streams
    for buffer in sorted(buffers.values(), key=lambda t: t.numel() * t.element_size(), reverse=True):
        smallest = sizes.index(min(sizes))
        groups[smallest].append(buffer)
        sizes[smallest] += buffer.numel() * buffer.element_size()
    return groups


def _byte_view(buffer: torch.Tensor) -> memoryview:
    return memoryview(buffer.reshape(-1).view(torch.uint8).numpy().data)


def _write_group(path: Path, group: list[torch.Tensor]) -> None:
    with open(path, "wb", buffering=0) as handle:
        for buffer in group:
            handle.write(_byte_view(buffer))
        os.fsync(handle.fileno())


def _read_group(path: Path, group: list[torch.Tensor]) -> None:
    with open(path, "rb", buffering=0) as handle:
        for buffer in group:
            view = _byte_view(buffer)
            while view:
                count = handle.readinto(view)
                if not count:
                    raise OSError(f"{path} is shorter than its buffers")
                view = view[count:]


def raw_paths(folder: Path, streams: int) -> list[Path]:
    return [folder / f"raw-{index}.bin" for index in range(streams)]


def measure_raw_write(buffers: dict[str, torch.Tensor], folder: Path, streams: int) -> float:
    """The floor for a save: the same bytes, written and fsynced as `streams` files by as many threads
    (what a save does with its files per rank), with no serialization, hashing or manifest."""
    groups = split_buffers(buffers, streams)
    began = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(_write_group, raw_paths(folder, streams), groups))
    return time.perf_counter() - began


def measure_raw_read(buffers: dict[str, torch.Tensor], folder: Path, streams: int) -> float:
    """The floor for a restore: those files read back cold, by as many threads, into the buffers."""
    paths = raw_paths(folder, streams)
    drop_cache(paths)
    groups = split_buffers(buffers, streams)
    began = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(_read_group, paths, groups))
    elapsed = time.perf_counter() - began
    for path in paths:
        path.unlink()
    return elapsed


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def goals_met(result: dict[str, Any]) -> dict[str, bool]:
    met: dict[str, bool] = {}
    for name, (bound, kind) in GOALS.items():
        value = float(result[name])
        met[name] = value <= bound if kind == "max" else value >= bound
    return met


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
    # The write speed is configured so that no restore runs the start-up storage probe: the restore
    # figure is the restore alone.
    sync_config = CheckpointConfig(
        dir=str(work / "sync"), async_save=False, keep=2, write_bytes_per_second=1e9
    )
    sync_manager = CheckpointManager(sync_config)
    async_manager = CheckpointManager(
        CheckpointConfig(dir=str(work / "async"), async_save=True, keep=2, write_bytes_per_second=1e9),
        writer_nice_increment=args.writer_nice,
    )
    # Warm-up: first-touch of staging buffers and of the page cache paths is not what we measure.
    measure_memcpy(tensors, buffers)
    sync_manager.save(0, app_state)
    async_manager.save(0, app_state)
    async_manager.wait()
    streams = sync_manager.io_threads  # the floor writes as many files at once as a save does
    measure_raw_write(buffers, work, streams)
    measure_raw_read(buffers, work, streams)

    samples: dict[str, list[float]] = {
        k: []
        for k in (
            "memcpy_seconds",
            "raw_write_seconds",
            "raw_read_seconds",
            "sync_save_seconds",
            "sync_write_seconds",
            "restore_seconds",
            "async_blocking_seconds",
            "async_total_seconds",
            "step_seconds",
            "step_seconds_during_save",
        )
    }
    orders: list[list[str]] = []

    def raw_phase() -> None:
        samples["raw_write_seconds"].append(measure_raw_write(buffers, work, streams))
        samples["raw_read_seconds"].append(measure_raw_read(buffers, work, streams))

    def sync_phase(repetition: int) -> None:
        began = time.perf_counter()
        sync_manager.save(repetition, app_state)
        samples["sync_save_seconds"].append(time.perf_counter() - began)
        assert sync_manager.last_save is not None
        samples["sync_write_seconds"].append(
            sync_manager.last_save.total_seconds - sync_manager.last_save.blocking_seconds
        )
        folder = work / "sync" / f"step-{repetition:08d}"
        drop_cache([path for path in folder.iterdir() if path.is_file()])
        began = time.perf_counter()
        restored = CheckpointManager(sync_config).restore(app_state)
        samples["restore_seconds"].append(time.perf_counter() - began)
        assert restored == repetition, f"restored {restored}, expected {repetition}"

    def async_phase(repetition: int) -> None:
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

    for repetition in range(1, args.repetitions + 1):
        samples["memcpy_seconds"].append(measure_memcpy(tensors, buffers))
        order = phase_order(repetition)
        orders.append(list(order))
        for phase in order:
            if phase == "raw":
                raw_phase()
            elif phase == "sync":
                sync_phase(repetition)
            else:
                async_phase(repetition)
        print(
            f"rep {repetition} ({', '.join(order)}): memcpy {samples['memcpy_seconds'][-1]:.3f}s "
            f"raw write {samples['raw_write_seconds'][-1]:.2f}s read {samples['raw_read_seconds'][-1]:.2f}s "
            f"sync {samples['sync_save_seconds'][-1]:.2f}s restore {samples['restore_seconds'][-1]:.2f}s "
            f"async blocking {samples['async_blocking_seconds'][-1]:.3f}s total {samples['async_total_seconds'][-1]:.2f}s "
            f"steps {samples['step_seconds'][-1]:.3f}s -> {samples['step_seconds_during_save'][-1]:.3f}s during",
            flush=True,
        )
    shutil.rmtree(work, ignore_errors=True)

    median = {key: statistics.median(values) for key, values in samples.items()}
    # Each goal's ratio within each repetition, where both sides ran minutes apart at most: on a
    # shared machine whose load drifts, the median of these pairs is the honest figure.
    pairs = {
        "blocking_vs_memcpy": ("async_blocking_seconds", "memcpy_seconds"),
        "write_throughput_ratio_vs_raw": ("raw_write_seconds", "sync_write_seconds"),
        "restore_throughput_ratio_vs_raw_read": ("raw_read_seconds", "restore_seconds"),
        "step_slowdown_during_save": ("step_seconds_during_save", "step_seconds"),
        "async_total_vs_sync_save": ("async_total_seconds", "sync_save_seconds"),
        "async_blocking_vs_sync_save": ("async_blocking_seconds", "sync_save_seconds"),
    }
    ratios = {
        name: [top / bottom for top, bottom in zip(samples[a], samples[b], strict=True)]
        for name, (a, b) in pairs.items()
    }
    result: dict[str, Any] = {
        "state_bytes": state_bytes,
        "device": str(device),
        "repetitions": args.repetitions,
        "memcpy_seconds": median["memcpy_seconds"],
        "sync_save_seconds": median["sync_save_seconds"],
        "async_blocking_seconds": median["async_blocking_seconds"],
        "async_total_seconds": median["async_total_seconds"],
        "blocking_vs_memcpy": statistics.median(ratios["blocking_vs_memcpy"]),
        "raw_write_seconds": median["raw_write_seconds"],
        # Our write path (DCP files, fsync, SHA-256 of every file, manifest, rename) against raw bytes.
        "write_throughput_ratio_vs_raw": statistics.median(ratios["write_throughput_ratio_vs_raw"]),
        "raw_read_seconds": median["raw_read_seconds"],
        "restore_seconds": median["restore_seconds"],
        # Our restore (structure check, SHA-256 of every file read, DCP load, per-rank state) against
        # reading the same bytes raw; both cold.
        "restore_throughput_ratio_vs_raw_read": statistics.median(
            ratios["restore_throughput_ratio_vs_raw_read"]
        ),
        "step_seconds": median["step_seconds"],
        "step_seconds_during_save": median["step_seconds_during_save"],
        "step_slowdown_during_save": statistics.median(ratios["step_slowdown_during_save"]),
        "async_total_vs_sync_save": statistics.median(ratios["async_total_vs_sync_save"]),
        "async_blocking_vs_sync_save": statistics.median(ratios["async_blocking_vs_sync_save"]),
        "spread": {key: spread(values) for key, values in samples.items()},
        "ratio_spread": {name: spread(values) for name, values in ratios.items()},
        "ratios_per_repetition": ratios,
        "phase_orders": orders,
        "samples": samples,
        "goals": {name: {"bound": bound, "kind": kind} for name, (bound, kind) in GOALS.items()},
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_at_end": list(os.getloadavg()),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "config": vars(args),
        "files_per_rank": streams,
    }
    result["goals_met"] = goals_met(result)
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
    print(table(result))


def table(result: dict[str, Any]) -> str:
    """The readable form: figure, median, spread, goal, met."""
    rows = ["| figure | median | min-max | goal | met |", "|---|---|---|---|---|"]
    seconds = [key for key in result["spread"]]
    for key in seconds:
        values = result["spread"][key]
        rows.append(f"| `{key}` | {values['median']:.3f} | {values['min']:.3f}-{values['max']:.3f} | | |")
    for name, (bound, kind) in GOALS.items():
        sign = "<=" if kind == "max" else ">="
        met = "yes" if result["goals_met"][name] else "**no**"
        low, high = result["ratio_spread"][name]["min"], result["ratio_spread"][name]["max"]
        rows.append(f"| `{name}` | {result[name]:.3f} | {low:.3f}-{high:.3f} | {sign} {bound} | {met} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
