"""A worker's start-up to a restored state, with the imported heap frozen (heap.py) and without.

    python bench/restore_bench.py [--pairs 6] [--ranks 4]

The demo job's model and trainer config (examples/demo-trainer.yaml) on `--ranks` gloo ranks forked
from this process, which has imported torch and the trainer, as the resident launcher's workers are.
Each round builds the Trainer and restores the newest checkpoint (a new one per round, written by a
short training run), timed from a barrier before the build to a barrier after the restore: wall
seconds and rank 0's CPU seconds. The two arms alternate, `--pairs` times. Writes
bench/results/restore.json and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from result_file import write_result

from phalanx.ports import free_port
from phalanx_trainer.config import load_config
from phalanx_trainer.distenv import DistEnv
from phalanx_trainer.heap import freeze_imported
from phalanx_trainer.logs import EventLog
from phalanx_trainer.train import Trainer

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
ARMS = ("unfrozen", "frozen")
STEPS_PER_ROUND = 4


def demo_overrides() -> list[str]:
    config = yaml.safe_load((REPO / "examples" / "demo-trainer.yaml").read_text())
    flat = [
        f"{section}.{key}={json.dumps(value)}"
        for section, fields in config.items()
        for key, value in fields.items()
    ]
    return [*flat, "metrics.port=0", "metrics.log_every=1000"]


def rank_main(rank: int, world: int, port: int, folder: str, steps: int, frozen: bool, out: str) -> None:
    # The unfrozen arm undoes what importing heap.py's users could have done in this process.
    gc.unfreeze()
    if frozen:
        freeze_imported()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    overrides = [*demo_overrides(), f"job.steps={steps}", f"checkpoint.dir={folder}",
                 f"checkpoint.interval_steps={STEPS_PER_ROUND}", "checkpoint.async_save=false"]  # fmt: skip
    config = load_config(None, overrides, world)
    env = DistEnv(rank, rank, world, 1, 0, world, "127.0.0.1", 0, 0, 120.0)
    dist.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    trainer = Trainer(config, env, log=EventLog(rank=1))
    restored = trainer.checkpoints.restore(trainer.app_state())
    dist.barrier()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    trainer.train()  # the next round's checkpoint
    if rank == 0:
        Path(out).write_text(json.dumps({"wall": wall, "cpu": cpu, "restored": restored}))
    trainer.close()
    dist.barrier()
    dist.destroy_process_group()


def run_round(world: int, folder: str, steps: int, frozen: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        out = str(Path(scratch) / "round.json")
        mp.start_processes(rank_main, args=(world, free_port(), folder, steps, frozen, out), nprocs=world,
                           start_method="fork")  # fmt: skip
        result: dict[str, Any] = json.loads(Path(out).read_text())
    return result


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as folder:
        steps = STEPS_PER_ROUND
        run_round(args.ranks, folder, steps, frozen=True)  # the first checkpoint; not counted
        for pair in range(args.pairs):
            for arm in ARMS if pair % 2 == 0 else ARMS[::-1]:
                steps += STEPS_PER_ROUND
                result = run_round(args.ranks, folder, steps, frozen=arm == "frozen")
                if result["restored"] != steps - STEPS_PER_ROUND:
                    raise RuntimeError(f"round {pair} {arm}: restored step {result['restored']}, "
                                       f"expected {steps - STEPS_PER_ROUND}")  # fmt: skip
                rounds[arm].append(result)
                print(f"pair {pair + 1}/{args.pairs} {arm:>8}: {result['wall']:.3f} s wall, "
                      f"{result['cpu']:.3f} s CPU (rank 0)", flush=True)  # fmt: skip
    summary = {arm: {"wall_seconds": spread([r["wall"] for r in rounds[arm]]),
                     "rank0_cpu_seconds": spread([r["cpu"] for r in rounds[arm]])} for arm in ARMS}  # fmt: skip
    ratios = [f["wall"] / u["wall"] for f, u in zip(rounds["frozen"], rounds["unfrozen"], strict=True)]
    result = write_result(RESULTS / "restore.json", {
        "benchmark": "build the trainer and restore the newest checkpoint, heap frozen vs not",
        "ranks": args.ranks, "pairs": args.pairs, "model": "examples/demo-trainer.yaml",
        **summary, "frozen_vs_unfrozen_wall_ratio": spread(ratios),
        "python": sys.version.split()[0], "torch": torch.__version__,
    })  # fmt: skip
    print(f"\n| {'arm':<9} | wall s median [min, max] | rank 0 CPU s median |")
    print(f"|{'-' * 11}|{'-' * 26}|{'-' * 21}|")
    for arm in ARMS:
        w, c = result[arm]["wall_seconds"], result[arm]["rank0_cpu_seconds"]
        print(
            f"| {arm:<9} | {w['median']:.3f} [{w['min']:.3f}, {w['max']:.3f}]{'':<4} | {c['median']:.3f}{'':<14} |"
        )
    r = result["frozen_vs_unfrozen_wall_ratio"]
    print(f"\nfrozen / unfrozen wall, per pair: median {r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
