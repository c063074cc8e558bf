"""Trainer throughput: Phalanx's loop against a plain hand-written PyTorch DDP loop.

Both train the same GPT (phalanx_trainer.models.gpt, about 3.3M parameters) on the same shipped text
with the same per-rank batch, AdamW with the same settings (lr, betas, eps, weight decay and kernel
choice, checked against Phalanx's optimizer before timing), global-norm clipping and cosine LR, on 2
gloo processes with one thread each. The machine this runs on is shared, and its load swings by 2x within a minute, so the two loops are
interleaved step by step: each pair of runs is one run of Phalanx's real `Trainer.train()` with a
baseline step slotted in beside each of its steps (before it on odd steps, after it on even ones),
each side charged its own time (Phalanx: everything between baseline steps, so all of its loop's
bookkeeping). Pairs repeat in one group of 2 processes after an untimed first pair; the warm-up steps
of each run are excluded. At least 9 pairs; the result is the median ratio with its spread.

No 1 -> 2 process scaling figure: on a shared 2-core machine it would measure the neighbours, and
interleaving it fairly needs a fresh process group per run.

    make bench-trainer            # writes bench/results/trainer.json and prints a table
    python bench/trainer_bench.py --pairs 11 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from phalanx.ports import free_port

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "trainer-image"))

from phalanx_trainer.config import TrainerConfig, load_config  # noqa: E402
from phalanx_trainer.dataset import build_source  # noqa: E402
from phalanx_trainer.distenv import DistEnv  # noqa: E402
from phalanx_trainer.logs import EventLog  # noqa: E402
from phalanx_trainer.models.gpt import GPT  # noqa: E402
from phalanx_trainer.schedule import lr_multiplier  # noqa: E402
from phalanx_trainer.train import Trainer  # noqa: E402

RESULTS = REPO / "bench" / "results" / "trainer.json"
MODEL = [
    "model.d_model=256",
    "model.n_layers=4",
    "model.n_heads=4",
    "model.seq_len=128",
    "data.batch_size=8",
    "optimizer.lr=0.001",
    "optimizer.grad_clip=1.0",
    "schedule.kind=cosine",
    "schedule.warmup_steps=2",
    "job.torch_threads=1",
    "metrics.port=0",
    "metrics.log_every=1000000",
]


def bench_config(world_size: int, steps: int) -> TrainerConfig:
    return load_config(None, [*MODEL, f"job.steps={steps}"], world_size)


class BaselineLoop:
    """What a careful user writes by hand: DDP, DataLoader, AdamW, clip, cosine LR; one step per call."""

    def __init__(self, rank: int, world_size: int, config: TrainerConfig) -> None:
        torch.manual_seed(config.job.seed)
        model: torch.nn.Module = GPT(config.model)
        if world_size > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        self.model = model
        self.clip = config.optimizer.grad_clip
        settings = config.optimizer
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=settings.lr,
            betas=(settings.beta1, settings.beta2),
            eps=settings.eps,
            weight_decay=settings.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_multiplier(step, config.schedule, config.job.steps)
        )
        source = build_source(config.data, config.model, config.job.seed)
        batch = config.data.batch_size

        def batches() -> Any:
            counter = 0
            while True:
                first = (counter * world_size + rank) * batch
                samples = [source.sample(index) for index in range(first, first + batch)]
                yield torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])
                counter += 1

        self.batches = iter(torch.utils.data.DataLoader(_Iterable(batches), batch_size=None))

    def step(self) -> None:
        inputs, targets = next(self.batches)
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()


class _Iterable(torch.utils.data.IterableDataset[Any]):
    def __init__(self, make: Any) -> None:
        self.make = make

    def __iter__(self) -> Any:
        return self.make()


OPTIMIZER_SETTINGS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "fused")


def assert_same_optimizer_settings(phalanx: torch.optim.Optimizer, baseline: torch.optim.Optimizer) -> None:
    """A ratio means nothing if the two sides do different work (the baseline once decayed weights)."""
    ours = {key: phalanx.param_groups[0].get(key) for key in OPTIMIZER_SETTINGS}
    theirs = {key: baseline.param_groups[0].get(key) for key in OPTIMIZER_SETTINGS}
    if type(phalanx) is not type(baseline) or ours != theirs:
        raise SystemExit(
            f"optimizer settings differ: phalanx {type(phalanx).__name__} {ours}, baseline {theirs}"
        )


def run_pair(rank: int, world_size: int, config: TrainerConfig, warmup: int) -> dict[str, float]:
    """Phalanx's real Trainer.train() with one baseline step slotted in beside each of its steps.

    Phalanx is charged everything between baseline steps (its step and all of its loop's bookkeeping);
    the baseline its own steps. The baseline goes first on odd steps and second on even ones.
    """
    env = DistEnv(rank, rank, world_size, 1, 0, world_size, "127.0.0.1", 0, 0, 60.0)
    baseline = BaselineLoop(rank, world_size, config)
    trainer = Trainer(config, env, log=EventLog(rank=1))
    assert_same_optimizer_settings(trainer.optimizer, baseline.optimizer)
    totals = {"phalanx_wall": 0.0, "baseline_wall": 0.0, "phalanx_cpu": 0.0, "baseline_cpu": 0.0}
    step_function = trainer.train_step
    state = {"step": 0, "wall": time.perf_counter(), "cpu": time.process_time()}

    def timed_baseline_step() -> None:
        began_wall, began_cpu = time.perf_counter(), time.process_time()
        baseline.step()
        ended_wall, ended_cpu = time.perf_counter(), time.process_time()
        if state["step"] > warmup:
            totals["baseline_wall"] += ended_wall - began_wall
            totals["baseline_cpu"] += ended_cpu - began_cpu
        # Phalanx's clock restarts after the baseline step.
        state["wall"] += ended_wall - began_wall
        state["cpu"] += ended_cpu - began_cpu

    def timed_step() -> Any:
        state["step"] += 1
        if state["step"] == warmup + 1:  # start both clocks after the warm-up steps
            state["wall"], state["cpu"] = time.perf_counter(), time.process_time()
        if state["step"] % 2 == 1:
            timed_baseline_step()
        result = step_function()
        if state["step"] % 2 == 0:
            timed_baseline_step()
        return result

    trainer.train_step = timed_step  # type: ignore[method-assign]
    trainer.train()
    ended_wall, ended_cpu = time.perf_counter(), time.process_time()
    trainer.close()
    totals["phalanx_wall"] = ended_wall - state["wall"]
    totals["phalanx_cpu"] = ended_cpu - state["cpu"]
    return totals


def _worker(rank: int, world_size: int, port: int, runs: int, steps: int, warmup: int, out: str) -> None:
    """`runs` paired runs in one process group; rank 0 records each run's tokens per second."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    if world_size > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    config = bench_config(world_size, steps)
    tokens = (steps - warmup) * config.data.batch_size * config.model.seq_len * world_size
    results: list[dict[str, float]] = []
    for _ in range(runs + 1):  # the first run is untimed: it pays for lazy initialisation
        if world_size > 1:
            dist.barrier()
        totals = run_pair(rank, world_size, config, warmup)
        results.append({key: tokens / seconds for key, seconds in totals.items() if seconds > 0})
    if rank == 0:
        Path(out).write_text(json.dumps(results[1:]))
    if world_size > 1:
        dist.destroy_process_group()


def measure(runs: int, world_size: int, steps: int, warmup: int) -> list[dict[str, float]]:
    """Tokens/s (per wall second, and per rank-0 CPU second) of each paired run, in one process group."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        mp.start_processes(
            _worker,
            args=(world_size, free_port(), runs, steps, warmup, out),
            nprocs=world_size,
            start_method="spawn",
        )
        results: list[dict[str, float]] = json.loads(Path(out).read_text())
        return results


def summarize(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "q1": quartiles[0],
        "q3": quartiles[2],
        "spread_percent": 100.0 * (ordered[-1] - ordered[0]) / statistics.median(ordered),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.pairs < 9:
        parser.error("--pairs must be >= 9 (the median of at least 9 interleaved pairs)")

    params = sum(p.numel() for p in GPT(bench_config(1, args.steps).model).parameters())
    load_before = os.getloadavg()[0]
    phalanx: list[float] = []
    baseline: list[float] = []
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    for pair, run in enumerate(measure(args.pairs, 2, args.steps, args.warmup)):
        phalanx.append(run["phalanx_wall"])
        baseline.append(run["baseline_wall"])
        ratios.append(run["phalanx_wall"] / run["baseline_wall"])
        cpu_ratios.append(run["phalanx_cpu"] / run["baseline_cpu"])
        print(
            f"pair {pair + 1}/{args.pairs}: phalanx {phalanx[-1]:9.1f} tok/s  "
            f"baseline {baseline[-1]:9.1f} tok/s  ratio {ratios[-1]:.3f}  (per CPU second {cpu_ratios[-1]:.3f})",
            flush=True,
        )

    result = {
        "phalanx_tokens_per_second": statistics.median(phalanx),
        "baseline_tokens_per_second": statistics.median(baseline),
        "ratio": statistics.median(ratios),
        "ratio_spread": summarize(ratios),
        "phalanx_runs": phalanx,
        "baseline_runs": baseline,
        "ratios": ratios,
        # Tokens per CPU second of rank 0: less sensitive to other jobs on a shared machine.
        "cpu_time_ratio": statistics.median(cpu_ratios),
        "cpu_time_ratios": cpu_ratios,
        "cpu_time_ratio_spread": summarize(cpu_ratios),
        "phalanx_spread": summarize(phalanx),
        "baseline_spread": summarize(baseline),
        "setup": {
            "model": f"GPT {params / 1e6:.2f}M parameters (d_model 256, 4 layers, 4 heads, seq 128, bytes)",
            "batch_per_rank": 8,
            "processes": 2,
            "backend": "gloo",
            "threads_per_process": 1,
            "steps_per_run": args.steps,
            "warmup_steps_excluded": args.warmup,
            "pairs": args.pairs,
            "optimizer": "AdamW, the same settings both sides (checked): "
            + json.dumps({k: v for k, v in vars(bench_config(2, args.steps).optimizer).items()}),
            "cpu_count": os.cpu_count(),
            "load_average_1m_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "torch": torch.__version__,
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "goal": "ratio >= 0.98",
    }
    result["goal_met"] = result["ratio"] >= 0.98
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    spread = result["ratio_spread"]
    print()
    print(f"{'':24}{'median':>12}{'min':>12}{'max':>12}")
    print(
        f"{'phalanx tok/s (2 proc)':24}{result['phalanx_tokens_per_second']:12.1f}{min(phalanx):12.1f}{max(phalanx):12.1f}"
    )
    print(
        f"{'baseline tok/s (2 proc)':24}{result['baseline_tokens_per_second']:12.1f}{min(baseline):12.1f}{max(baseline):12.1f}"
    )
    print(f"{'ratio':24}{result['ratio']:12.3f}{spread['min']:12.3f}{spread['max']:12.3f}")
    print(
        f"{'ratio per CPU second':24}{result['cpu_time_ratio']:12.3f}{min(cpu_ratios):12.3f}{max(cpu_ratios):12.3f}"
    )
    print(f"goal {result['goal']}: {'met' if result['goal_met'] else 'not met'}; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
