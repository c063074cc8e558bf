"""Recovery benchmark: full gang restart, restart in place and in place with a warm spare, side by side in one run.

    python bench/recovery_bench.py [--rounds 3] [--evictions-per-job 2] [--steps 400]
                                   [--paths full_restart,in_place,in_place_spare]

Brings up its own local cluster with one dev node and the operator (phalanx.demo's set-up). Each
round runs the demo job once per path, the order alternating from round to round so that a slow
patch of the shared machine falls on both, and evicts worker-1 (through the Eviction API, as
`kubectl drain` does) `--evictions-per-job` times per job, at evenly spaced steps, each after the
previous recovery has completed. Worker-0 is not evicted: it hosts the rendezvous store, and losing
it makes an in-place job fall back to a full restart (docs/reliability.md). Paths:

- full_restart: spec.runPolicy.restartStrategy FullRestart (today's default): every pod goes, every
  rank starts cold;
- in_place: restartStrategy InPlace: the surviving pod keeps its warm launcher, only the lost pod is
  replaced.
- in_place_spare: restartStrategy InPlace with spec.spares 1: a warm spare standing by (imports
  done) takes the lost rank, no pod is created for it; each eviction waits until the spare made
  after the previous one stands by, imports done (its launcher answers GET /generation: the dev
  node runs no readiness probe).

Per eviction, from the job's status.lastRecovery (the operator's timeline, docs/observability.md):
- recover_seconds: the Eviction call -> the first training step of the new attempt (every rank is
  training again: a step needs every rank's gradients), wall clock on this machine;
- the phase split (ms since the operator saw the disruption): podsStopped, podsRunning,
  rendezvousDone, stateRestored, firstStep;
- the path the operator took (status.lastRecovery.path): an in-place job that fell back to a full
  restart is reported as such, never counted as in place.
Per path: median, worst and spread of recover_seconds over all its evictions, the median phase split,
and each job's status.goodput.ratio. Writes bench/results/recovery.json and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from result_file import write_result

from phalanx.demo import JOB, Demo
from phalanx.policy.recovery_timeline import parse_time

RESULTS = Path(__file__).resolve().parent / "results"
STRATEGY = {"full_restart": "FullRestart", "in_place": "InPlace", "in_place_spare": "InPlace"}
SPARES = {"in_place_spare": 1}
# status.lastRecovery.path of a recovery that took the path asked for
TAKEN_PATH = {"full_restart": "FullRestart", "in_place": "InPlace", "in_place_spare": "InPlaceSpare"}
PHASES = ("podsStopped", "podsRunning", "rendezvousDone", "stateRestored", "firstStep")


def run_job(demo: Demo, path: str, steps: int, evictions: int, timeout: float) -> dict[str, Any]:
    """Submits the job on `path`, evicts at evenly spaced steps once the last recovery completed,
    waits for the end; returns each recovery and the job's goodput."""
    began = time.monotonic()
    demo.submit(steps, run_policy={"restartStrategy": STRATEGY[path]}, spares=SPARES.get(path, 0))
    targets = [steps * (k + 1) // (evictions + 1) for k in range(evictions)]
    recoveries: list[dict[str, Any]] = []
    evicted_at: float | None = None  # wall clock of the pending eviction
    status: dict[str, Any] = {}
    while time.monotonic() - began < timeout:
        status = demo.job_status()
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        recovery = status.get("lastRecovery") or {}
        if evicted_at is not None and recovery.get("attempt") == len(recoveries) + 1 and _complete(recovery):
            recoveries.append(_recovery_numbers(recovery, evicted_at))
            demo.say(f"  {path}: training again {recoveries[-1]['recover_seconds']:.1f}s after the eviction "
                     f"({recoveries[-1]['path']}: {recovery.get('summary', '')})")  # fmt: skip
            evicted_at = None
        step = (status.get("progress") or {}).get("step")
        if evicted_at is None and len(recoveries) < len(targets) and isinstance(step, int):
            if (
                step >= targets[len(recoveries)]
                and status.get("phase") == "Running"
                and (path not in SPARES or spare_warm(demo))
            ):
                # The same disruption on every path (losing worker-0 falls back): the pod serving rank 1,
                # worker-1, or the spare that took its rank in an earlier eviction.
                pod = rank_1_pod(demo) or f"{JOB}-worker-1"
                demo.say(f"  {path}: step {step}: evicting {pod}")
                evicted_at = time.time()
                demo.evict(pod)
        time.sleep(0.2)
    elapsed = time.monotonic() - began
    if status.get("phase") != "Succeeded":
        raise RuntimeError(f"{path}: the job ended {status.get('phase') or 'nowhere'} after {elapsed:.0f}s; "
                           f"see {demo.out_dir}")  # fmt: skip
    if len(recoveries) < evictions:
        raise RuntimeError(f"{path}: the job finished after {len(recoveries)} of {evictions} evictions; "
                           "give it more --steps")  # fmt: skip
    return {
        "recoveries": recoveries,
        "goodput_ratio": float((status.get("goodput") or {}).get("ratio") or 0.0),
        "elapsed_seconds": round(elapsed, 2),
        "restarts": status.get("restarts"),
    }


def rank_1_pod(demo: Demo) -> str | None:
    """The running pod labelled rank 1 (a spare that took the rank is relabelled)."""
    from kubernetes import client

    pods = client.CoreV1Api(demo.api).list_namespaced_pod(
        demo.namespace, label_selector="phalanx.dev/replica-index=1"
    )
    running = [
        p.metadata.name
        for p in pods.items
        if p.metadata.deletion_timestamp is None and p.status is not None and p.status.phase == "Running"
    ]
    return running[0] if len(running) == 1 else None


def spare_warm(demo: Demo) -> bool:
    """A spare of the job stands by with its imports done: its launcher says `spare`."""
    import json
    import urllib.request

    from kubernetes import client

    pods = client.CoreV1Api(demo.api).list_namespaced_pod(
        demo.namespace, label_selector="phalanx.dev/spare=true"
    )
    for pod in pods.items:
        ip = pod.status.pod_ip if pod.status is not None else None
        if not ip or pod.metadata.deletion_timestamp is not None:
            continue
        try:
            with urllib.request.urlopen(f"http://{ip}:9399/generation", timeout=1) as answer:
                if json.loads(answer.read()).get("state") == "spare":
                    return True
        except OSError:
            continue
    return False


def _complete(recovery: dict[str, Any]) -> bool:
    return "firstStep" in (recovery.get("phasesMilliseconds") or {})


def _recovery_numbers(recovery: dict[str, Any], evicted_at: float) -> dict[str, Any]:
    phases = recovery["phasesMilliseconds"]
    disrupted = parse_time(recovery.get("disruptedTime")) or evicted_at
    first_step = disrupted + phases["firstStep"] / 1000
    return {
        "recover_seconds": round(first_step - evicted_at, 3),
        "path": recovery.get("path"),
        "reason": recovery.get("reason"),
        "seen_after_seconds": round(disrupted - evicted_at, 3),  # eviction -> the operator saw it
        "phases_ms": {phase: phases[phase] for phase in PHASES if phase in phases},
    }


def path_summary(jobs: list[dict[str, Any]], path: str) -> dict[str, Any]:
    recoveries = [r for job in jobs for r in job["recoveries"]]
    # What the operator did, not what was asked: fallbacks to a full restart are counted apart.
    taken = [r for r in recoveries if _took(r, path)]
    seconds = sorted(r["recover_seconds"] for r in taken)
    return {
        "evictions": len(recoveries),
        "took_this_path": len(taken),
        "fell_back": [r["path"] for r in recoveries if not _took(r, path)],
        "recover_seconds_median": round(statistics.median(seconds), 2) if seconds else None,
        "recover_seconds_worst": round(seconds[-1], 2) if seconds else None,
        "recover_seconds_best": round(seconds[0], 2) if seconds else None,
        "recover_seconds_each": [r["recover_seconds"] for r in taken],
        "phases_ms_median": {
            phase: round(statistics.median(values))
            for phase in PHASES
            if (values := [r["phases_ms"][phase] for r in taken if phase in r["phases_ms"]])
        },
        "goodput_ratio_each": [job["goodput_ratio"] for job in jobs],
    }


def _took(recovery: dict[str, Any], path: str) -> bool:
    return recovery["path"] == TAKEN_PATH[path]


def table(summary: dict[str, dict[str, Any]]) -> str:
    header = f"{'path':<14} {'evictions':>9} {'median s':>9} {'worst s':>8} " + " ".join(
        f"{p:>14}" for p in PHASES
    )
    lines = [header, "-" * len(header)]
    for path, s in summary.items():
        phases = " ".join(f"{s['phases_ms_median'].get(p, '-'):>14}" for p in PHASES)
        lines.append(f"{path:<14} {s['took_this_path']:>4}/{s['evictions']:<4} "
                     f"{s['recover_seconds_median'] or '-':>9} {s['recover_seconds_worst'] or '-':>8} {phases}")  # fmt: skip
    lines.append("(phases: ms from the operator seeing the disruption to the end of each)")
    return "\n".join(lines)


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--evictions-per-job", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument(
        "--paths",
        default="full_restart,in_place,in_place_spare",
        help=f"comma-separated: {', '.join(STRATEGY)}",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    parser.add_argument("--out", type=Path, default=RESULTS / "recovery.json")
    args = parser.parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in STRATEGY]
    if unknown:
        parser.error(f"--paths: unknown {unknown}; choose from {', '.join(STRATEGY)}")

    from phalanx.devcluster.cluster import default_state_dir

    state_dir = default_state_dir("bench-recovery")
    work = state_dir.parent / "bench-recovery-runs"  # checkpoints and logs, one directory per job
    jobs: dict[str, list[dict[str, Any]]] = {path: [] for path in paths}
    first = Demo(work / "setup", state_dir, say, namespace="bench-setup")
    (work / "setup").mkdir(parents=True, exist_ok=True)
    try:
        first.up()
        for round_ in range(args.rounds):
            order = paths if round_ % 2 == 0 else list(reversed(paths))
            for path in order:
                name = f"{path.replace('_', '-')}-{round_}"
                (work / name).mkdir(parents=True, exist_ok=True)
                demo = Demo(work / name, first.cluster.state_dir, say, namespace=f"bench-{name}")
                demo.kubectl, demo.api = first.kubectl, first.api
                say(f"round {round_ + 1}/{args.rounds}, {path}: {args.steps} steps, "
                    f"{args.evictions_per_job} evictions")  # fmt: skip
                jobs[path].append(run_job(demo, path, args.steps, args.evictions_per_job, args.timeout))
    finally:
        first.down()

    summary = {path: path_summary(jobs[path], path) for path in paths}
    result = {
        "benchmark": "recovery",
        "job": f"{JOB} (examples/demo-trainingjob.yaml): 2 pods x 2 processes, small GPT, CPU, gloo",
        "steps": args.steps,
        "rounds": args.rounds,
        "evictions_per_job": args.evictions_per_job,
        **summary,
        "jobs": jobs,
    }
    write_result(args.out, result)
    print(table(summary))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
