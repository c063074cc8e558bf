"""Goodput under preemption: a long job evicted every few minutes, restart in place against a full
gang restart, in the same run. Not part of CI: at its defaults it takes over an hour.

    python bench/goodput_bench.py [--minutes 30] [--evict-every 300] [--checkpoint-every 120]
                                  [--paths in_place,full_restart]

1. A reference run of the demo job, undisturbed, gives the median step time of this machine now
   (wall clock between one step's progress line and the next: the whole loop, logging included,
   as an undisturbed run goes; the trainer's own step time, which leaves the loop out, is reported
   beside it).
2. Per path, a job sized to train for about `--minutes` undisturbed, with worker-1 evicted
   (Eviction API) every `--evict-every` seconds of wall time, each once the previous recovery
   completed (worker-0 hosts the rendezvous store: losing it falls back to a full restart).
   Periodic checkpoints every `--checkpoint-every` seconds of undisturbed steps, the same on both
   paths (the demo's 25 steps are a few seconds here, a smoke-test cadence; an eviction saves its
   own checkpoint at SIGTERM either way, so the interval bounds only what a hard kill loses).

goodput = (steps in the final model x the median step time) / (wall time from submission to success):
start-up, recovery, redone steps and checkpoint stalls all count against it. The median step time is
the faster of the reference run's and the evicted run's own median step (recoveries and stalls sit
in its tail): the reference runs on a control plane that has just started, and a slower reference
would lift goodput (`goodput_by_reference` keeps that figure). Writes
bench/results/goodput.json: `goodput` (restart in place), `goodput_full_restart`, the reference step
time, the evictions and each job's status.goodput ledger (the operator's own accounting of the same
time, by cause), and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from recovery_bench import rank_1_pod
from result_file import write_result

from phalanx.demo import JOB, Demo, StepRecord, kept_steps, parse_trainer_log

RESULTS = Path(__file__).resolve().parent / "results"
STRATEGY = {"full_restart": "FullRestart", "in_place": "InPlace", "in_place_spare": "InPlace"}
SPARES = {"in_place_spare": 1}  # a warm spare standing by takes the lost rank


def say(line: str) -> None:
    print(line, flush=True)


def median_wall_step(records: Iterable[StepRecord]) -> float | None:
    """The median seconds between one step's progress line and the next (the whole loop: the step,
    the loss's all-reduce, logging, /progress). Pairs that straddle a recovery are far out in the
    tail, so the median is the undisturbed pace even within an evicted run."""
    ordered = sorted(records, key=lambda r: r.step)
    gaps = [
        b.logged_at - a.logged_at
        for a, b in zip(ordered, ordered[1:], strict=False)
        if a.step > 1 and b.step == a.step + 1 and a.logged_at is not None and b.logged_at is not None
    ]
    return statistics.median(gaps) if gaps else None


def reference_step_seconds(demo: Demo, steps: int, timeout: float) -> tuple[float, float]:
    """(wall, compute): the undisturbed run's median wall step (median_wall_step), and the median
    of the trainer's own step time (data wait, forward/backward, optimizer)."""
    # Undisturbed means no periodic checkpoint either: the evicted runs' checkpoints (and their
    # stalls) count against their goodput, so the reference must not carry any.
    demo.submit(steps, checkpoint_interval_steps=steps)
    wait_done(demo, timeout, "reference")
    records = list(kept_steps(parse_trainer_log(demo.rank0_log())).values())
    compute = [r.step_seconds for r in records if r.step > 1]  # the first step warms up
    wall = median_wall_step(records)
    if not compute or wall is None:
        raise RuntimeError(f"the reference run logged too few steps; see {demo.out_dir}")
    return wall, statistics.median(compute)


def conservative_goodput(steps: int, wall_seconds: float, reference: float, in_run: float | None) -> float:
    """Goodput by the faster of the two undisturbed paces: the reference run's, and the evicted run's
    own median step. The reference runs first, on a control plane that has just started; were it
    slower than the run's own steps, goodput by it alone would come out too high (above 1, even)."""
    step = min(reference, in_run) if in_run is not None else reference
    return round(steps * step / wall_seconds, 4)


def wait_done(demo: Demo, timeout: float, what: str) -> dict[str, Any]:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        status = demo.job_status()
        if status.get("phase") == "Succeeded":
            return status
        if status.get("phase") == "Failed":
            raise RuntimeError(f"{what}: the job failed ({status.get('message')}); see {demo.out_dir}")
        time.sleep(1.0)
    raise RuntimeError(f"{what}: not done after {timeout:.0f}s; see {demo.out_dir}")


def evicted_run(demo: Demo, path: str, steps: int, every: float, step_seconds: float,
                timeout: float, checkpoint_interval_steps: int) -> dict[str, Any]:  # fmt: skip
    submitted = time.time()
    demo.submit(steps, run_policy={"restartStrategy": STRATEGY[path]}, spares=SPARES.get(path, 0),
                checkpoint_interval_steps=checkpoint_interval_steps)  # fmt: skip
    evictions: list[dict[str, Any]] = []
    next_at = submitted + every
    last_report = 0.0
    status: dict[str, Any] = {}
    while time.time() - submitted < timeout:
        status = demo.job_status()
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        recovery = status.get("lastRecovery") or {}
        recovered = "firstStep" in (recovery.get("phasesMilliseconds") or {})
        settled = not evictions or (recovery.get("attempt") == len(evictions) and recovered)
        if (
            evictions
            and recovered
            and "path" not in evictions[-1]
            and recovery.get("attempt") == len(evictions)
        ):
            evictions[-1].update(path=recovery.get("path"), summary=recovery.get("summary"))
        if time.time() >= next_at and settled and status.get("phase") == "Running":
            # Losing worker-0 (the rendezvous host) falls back to a full restart: the pod serving rank 1,
            # worker-1 or the spare that took its rank in an earlier eviction.
            pod = rank_1_pod(demo) or f"{JOB}-worker-1"
            step = (status.get("progress") or {}).get("step")
            evictions.append({"at_seconds": round(time.time() - submitted, 1), "pod": pod, "step": step})
            say(f"  {path}: {time.time() - submitted:.0f}s, step {step}: evicting {pod}")
            demo.evict(pod)
            next_at = time.time() + every
        if time.time() - last_report >= 60:
            last_report = time.time()
            progress = status.get("progress") or {}
            say(f"  {path}: {time.time() - submitted:.0f}s, step {progress.get('step')}/{steps}, "
                f"goodput so far {(status.get('goodput') or {}).get('ratio')}")  # fmt: skip
        time.sleep(0.5)
    wall = time.time() - submitted
    if status.get("phase") != "Succeeded":
        raise RuntimeError(f"{path}: the job ended {status.get('phase') or 'nowhere'} after {wall:.0f}s")
    kept = kept_steps(parse_trainer_log(demo.rank0_log()))
    final_steps = max(kept, default=0)
    in_run = median_wall_step(kept.values())
    return {
        "goodput": conservative_goodput(final_steps, wall, step_seconds, in_run),
        "goodput_by_reference": round(final_steps * step_seconds / wall, 4),
        "in_run_median_step_seconds": None if in_run is None else round(in_run, 5),
        "steps": final_steps,
        "wall_seconds": round(wall, 1),
        "evictions": evictions,
        "restarts": status.get("restarts"),
        "ledger": status.get("goodput"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="undisturbed training time per job")
    parser.add_argument("--evict-every", type=float, default=300.0, help="seconds between evictions")
    parser.add_argument("--paths", default="in_place,full_restart")
    parser.add_argument("--reference-steps", type=int, default=2000)
    parser.add_argument("--checkpoint-every", type=float, default=120.0,
                        help="seconds of undisturbed training between periodic checkpoints (both paths)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS / "goodput.json")
    args = parser.parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if unknown := [p for p in paths if p not in STRATEGY]:
        parser.error(f"--paths: unknown {unknown}; choose from {', '.join(STRATEGY)}")

    from phalanx.devcluster.cluster import default_state_dir

    state_dir = default_state_dir("bench-goodput")
    work = state_dir.parent / "bench-goodput-runs"
    (work / "reference").mkdir(parents=True, exist_ok=True)
    reference = Demo(work / "reference", state_dir, say, namespace="goodput-reference")
    runs: dict[str, dict[str, Any]] = {}
    try:
        reference.up()
        say(f"reference: {args.reference_steps} steps, undisturbed")
        step_seconds, compute_step_seconds = reference_step_seconds(
            reference, args.reference_steps, timeout=1800
        )
        steps = max(args.reference_steps, int(args.minutes * 60 / step_seconds))
        interval = max(1, round(args.checkpoint_every / step_seconds))
        say(f"median step {step_seconds * 1000:.1f} ms: {steps} steps per job (~{args.minutes:.0f} min), "
            f"a checkpoint every {interval} steps (~{args.checkpoint_every:.0f} s)")  # fmt: skip
        for path in paths:
            (work / path).mkdir(parents=True, exist_ok=True)
            demo = Demo(
                work / path, reference.cluster.state_dir, say, namespace=f"goodput-{path.replace('_', '-')}"
            )
            demo.kubectl, demo.api = reference.kubectl, reference.api
            say(f"{path}: {steps} steps, an eviction every {args.evict_every:.0f}s")
            runs[path] = evicted_run(demo, path, steps, args.evict_every, step_seconds,
                                     timeout=max(3600.0, 4 * args.minutes * 60),
                                     checkpoint_interval_steps=interval)  # fmt: skip
    finally:
        reference.down()

    result = {
        "benchmark": "goodput",
        "goodput": runs.get("in_place", {}).get("goodput"),
        "goodput_full_restart": runs.get("full_restart", {}).get("goodput"),
        "goodput_in_place_spare": runs.get("in_place_spare", {}).get("goodput"),
        "goal": 0.97,
        "reference_step_seconds": round(step_seconds, 5),
        # The trainer's own step time leaves out the loop around it (logging, the loss's all-reduce),
        # a sizable share of the demo model's short steps. Goodput by it, for comparison:
        "reference_compute_step_seconds": round(compute_step_seconds, 5),
        "goodput_by_compute_step": {
            path: round(run["steps"] * compute_step_seconds / run["wall_seconds"], 4)
            for path, run in runs.items()
        },
        "minutes": args.minutes,
        "evict_every_seconds": args.evict_every,
        "checkpoint_every_seconds": args.checkpoint_every,
        "checkpoint_interval_steps": interval,
        "runs": runs,
    }
    write_result(args.out, result)
    say(f"{'path':<14} {'goodput':>8} {'evictions':>9} {'wall s':>8}  operator's ratio")
    for path, run in runs.items():
        ratio = (run["ledger"] or {}).get("ratio")
        say(f"{path:<14} {run['goodput']:>8} {len(run['evictions']):>9} {run['wall_seconds']:>8}  {ratio}")
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
