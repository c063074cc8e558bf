"""Recovery benchmark: the demo job evicted several times; how fast it trains again and what it costs.

    python bench/recovery_bench.py [--evictions 3] [--steps 400] [--no-baseline]

Brings up its own local cluster with one dev node and the operator (phalanx.demo's set-up), runs the
demo job once uninterrupted (the baseline) and once with `--evictions` evictions spread evenly over
the run, alternating between the two workers, each sent through the Eviction API. Writes
bench/results/recovery.json:

- recover_seconds: eviction -> rank 0 logs its first step of the new attempt (a step needs every
  rank's gradients, so every rank is training again); the median and each value;
- lost_steps: steps run again after each restart (0 when the SIGTERM checkpoint fits the grace period);
- goodput: step time of the steps the final model is made of / elapsed time from submission, for both
  runs; the gap is what the evictions cost (restart, start-up, redone work).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from phalanx.demo import JOB, Demo, parse_trainer_log, summarize

RESULTS = Path(__file__).resolve().parent / "results"


def run_job(demo: Demo, steps: int, evictions: int, timeout: float) -> dict[str, Any]:
    """Submits the job, evicts at evenly spaced steps, waits for the end; returns the run's numbers."""
    began = time.monotonic()
    demo.submit(steps)
    targets = [steps * (k + 1) // (evictions + 1) for k in range(evictions)]
    recover: list[float] = []
    evicted_at: float | None = None
    phase = ""
    while time.monotonic() - began < timeout:
        phase = demo.job_status().get("phase", "")
        if phase in ("Succeeded", "Failed"):
            break
        attempts = parse_trainer_log(demo.rank0_log())
        if evicted_at is not None and len(attempts) == len(recover) + 2 and attempts[-1].steps:
            recover.append(time.monotonic() - evicted_at)
            demo.say(f"  attempt {len(attempts) - 1} training again after {recover[-1]:.1f}s")
            evicted_at = None
        next_target = targets[len(recover)] if len(recover) < len(targets) else None
        current = attempts[-1] if attempts else None
        if evicted_at is None and next_target is not None and current is not None and current.steps:
            if current.last_step >= next_target:
                pod = f"{JOB}-worker-{(len(recover) + 1) % 2}"
                demo.say(f"  step {current.last_step}: evicting {pod}")
                demo.evict(pod)
                evicted_at = time.monotonic()
        time.sleep(0.2)
    elapsed = time.monotonic() - began
    if phase != "Succeeded":
        raise RuntimeError(f"the job ended {phase or 'nowhere'} after {elapsed:.0f}s; see {demo.out_dir}")
    attempts = parse_trainer_log(demo.rank0_log())
    summary = summarize(attempts, elapsed, recover)
    return {"phase": phase, "evictions": len(recover), **summary.to_dict()}


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evictions", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--no-baseline", action="store_true", help="skip the uninterrupted run")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=RESULTS / "recovery.json")
    args = parser.parse_args(argv)

    from phalanx.devcluster.cluster import default_state_dir

    state_dir = default_state_dir("bench-recovery")
    work = (
        state_dir.parent / "bench-recovery-runs"
    )  # checkpoints and logs of the two runs, one directory each
    for run_dir in ("baseline", "evicted"):
        (work / run_dir).mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    demo = Demo(work / "evicted", state_dir, say, namespace="bench-evicted")
    try:
        demo.up()
        if not args.no_baseline:
            say(f"baseline: {args.steps} steps, no eviction")
            baseline = Demo(work / "baseline", demo.cluster.state_dir, say, namespace="bench-baseline")
            baseline.kubectl, baseline.api = demo.kubectl, demo.api
            runs["baseline"] = run_job(baseline, args.steps, 0, args.timeout)
        say(f"evicted: {args.steps} steps, {args.evictions} evictions")
        runs["evicted"] = run_job(demo, args.steps, args.evictions, args.timeout)
    finally:
        demo.down()

    evicted = runs["evicted"]
    result = {
        "benchmark": "recovery",
        "job": f"{JOB} (examples/demo-trainingjob.yaml): 2 pods x 2 processes, small GPT, CPU, gloo",
        "steps": args.steps,
        "evictions": evicted["evictions"],
        "recover_seconds": statistics.median(evicted["recover_seconds"])
        if evicted["recover_seconds"]
        else None,
        "recover_seconds_each": evicted["recover_seconds"],
        "lost_steps": evicted["lost_steps"],
        "goodput": evicted["goodput"],
        "goodput_baseline": runs.get("baseline", {}).get("goodput"),
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps({k: result[k] for k in ("recover_seconds", "lost_steps", "goodput", "goodput_baseline")})
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
