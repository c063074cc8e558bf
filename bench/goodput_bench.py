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
import json
import statistics
import sys
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from recovery_bench import rank_1_pod
from result_file import write_result

from phalanx.demo import JOB, Demo, StepRecord, kept_steps, parse_trainer_log

RESULTS = Path(__file__).resolve().parent / "results"
STRATEGY = {"full_restart": "FullRestart", "in_place": "InPlace", "in_place_spare": "InPlace"}
SPARES = {"in_place_spare": 1}  # a warm spare standing by takes the lost rank
NO_EVICTION_BEFORE_THE_END_SECONDS = 30.0


def say(line: str) -> None:
    print(line, flush=True)


def wall_step(records: Iterable[StepRecord]) -> float | None:
    """The undisturbed pace: the mean of the middle half of the gaps between one step's progress
    line and the next (the whole loop: the step, the loss's all-reduce, logging, /progress). Pairs
    that straddle a recovery or a checkpoint stall sit in the upper quarter, outside it. Not the
    median: the lines carry millisecond times, so every gap is a whole number of ms, and a median
    of ~28 ms steps would be off by up to half a millisecond (1.8 %); a mean of many is not."""
    ordered = sorted(records, key=lambda r: r.step)
    gaps = sorted(
        b.logged_at - a.logged_at
        for a, b in zip(ordered, ordered[1:], strict=False)
        if a.step > 1 and b.step == a.step + 1 and a.logged_at is not None and b.logged_at is not None
    )
    if len(gaps) < 4:
        return None
    middle = gaps[len(gaps) // 4 : len(gaps) - len(gaps) // 4]
    return sum(middle) / len(middle)


LONG_GAP_SECONDS = 0.25  # between two steps: a recovery or a stall, not a step (~28 ms here)


def gap_profile(records: Iterable[StepRecord]) -> dict[str, float]:
    """Where a run's time between its first and last step went: long gaps (recoveries, stalls) and
    the steps' own time (count and sum), so that summarize() can split the loss by kind."""
    ordered = sorted(records, key=lambda r: r.step)
    gaps = [
        b.logged_at - a.logged_at
        for a, b in zip(ordered, ordered[1:], strict=False)
        if a.logged_at is not None and b.logged_at is not None
    ]
    short = [g for g in gaps if g <= LONG_GAP_SECONDS]
    return {
        "span_seconds": sum(gaps),
        "long_gaps_seconds": sum(g for g in gaps if g > LONG_GAP_SECONDS),
        "long_gaps": sum(1 for g in gaps if g > LONG_GAP_SECONDS),
        "short_gaps": len(short),
        "short_gaps_seconds": sum(short),
    }


def reference_steps(demo: Demo, steps: int, timeout: float) -> dict[int, StepRecord]:
    """Runs the job undisturbed and returns its steps."""
    # Undisturbed means no periodic checkpoint either: the evicted runs' checkpoints (and their
    # stalls) count against their goodput, so the reference must not carry any.
    demo.submit(steps, checkpoint_interval_steps=steps)
    wait_done(demo, timeout, "reference")
    return kept_steps(parse_trainer_log(demo.rank0_log()))


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


def evicted_run(demo: Demo, path: str, steps: int, every: float, pace: float, timeout: float,
                checkpoint_interval_steps: int) -> dict[str, Any]:  # fmt: skip
    """`pace`: the reference step time, which says when the job nears its end."""
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
        # A recovery of a later attempt than the one evicted: an in-place attempt that fell back to
        # a full restart takes one more attempt, and the recovery with it.
        settled = not evictions or (
            recovered and int(recovery.get("attempt") or 0) > evictions[-1]["attempt"]
        )
        if evictions and settled and "path" not in evictions[-1]:
            evictions[-1].update(path=recovery.get("path"), summary=recovery.get("summary"))
        step = int((status.get("progress") or {}).get("step") or 0)
        # Not in the last stretch: a pod that has finished cannot be evicted, and a recovery cut
        # short by the end of the job says nothing.
        near_the_end = (steps - step) * pace < NO_EVICTION_BEFORE_THE_END_SECONDS
        if time.time() >= next_at and settled and status.get("phase") == "Running" and not near_the_end:
            # Losing worker-0 (the rendezvous host) falls back to a full restart: the pod serving rank 1,
            # worker-1 or the spare that took its rank in an earlier eviction.
            pod = rank_1_pod(demo) or f"{JOB}-worker-1"
            eviction = {"at_seconds": round(time.time() - submitted, 1), "pod": pod, "step": step,
                        "attempt": int(status.get("attempt") or 0)}  # fmt: skip
            say(f"  {path}: {time.time() - submitted:.0f}s, step {step}: evicting {pod}")
            try:
                demo.evict(pod)
                evictions.append(eviction)
            except Exception as err:  # the pod went in between (the API's answer): try again later
                say(
                    f"  {path}: the eviction of {pod} failed ({str(err).splitlines()[0][:200]}); retrying in 10 s"
                )
                next_at = time.time() + 10
                continue
            next_at = time.time() + every
        if time.time() - last_report >= 60:
            last_report = time.time()
            say(f"  {path}: {time.time() - submitted:.0f}s, step {step}/{steps}, "
                f"goodput so far {(status.get('goodput') or {}).get('ratio')}")  # fmt: skip
        time.sleep(0.5)
    wall = time.time() - submitted
    if status.get("phase") != "Succeeded":
        raise RuntimeError(f"{path}: the job ended {status.get('phase') or 'nowhere'} after {wall:.0f}s")
    kept = kept_steps(parse_trainer_log(demo.rank0_log()))
    return {
        "steps": max(kept, default=0),
        "wall_seconds": round(wall, 1),
        "in_run_step_seconds": wall_step(kept.values()),
        "gaps": gap_profile(kept.values()),
        "evictions": evictions,
        "restarts": status.get("restarts"),
        "ledger": status.get("goodput"),
    }


def summarize(reference: Mapping[int, StepRecord], runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Goodput per path by the stricter of two undisturbed paces: the reference run's and the run's
    own (wall_step, its steps between recoveries). The reference runs first, on a control plane that
    has just started, and the paths run one after another while the shared machine drifts; a slower
    yardstick would lift goodput, above 1 even. `goodput_by_reference` and `goodput_by_fastest_pace`
    (the fastest pace seen in the whole benchmark, for every path) keep the other readings."""
    reference_step = wall_step(reference.values())
    compute = [r.step_seconds for r in reference.values() if r.step > 1]  # the first step warms up
    if reference_step is None or not compute:
        raise RuntimeError("the reference run logged too few steps")
    paces = {"reference": reference_step} | {
        path: run["in_run_step_seconds"] for path, run in runs.items() if run.get("in_run_step_seconds")
    }
    fastest = min(paces.values())
    compute_step = statistics.median(compute)
    for path, run in runs.items():
        step = min(reference_step, paces.get(path, reference_step))
        run["step_seconds"] = round(step, 6)
        run["goodput"] = round(run["steps"] * step / run["wall_seconds"], 4)
        run["goodput_by_reference"] = round(run["steps"] * reference_step / run["wall_seconds"], 4)
        run["goodput_by_fastest_pace"] = round(run["steps"] * fastest / run["wall_seconds"], 4)
        gaps = run.get("gaps")
        if gaps:
            # The wall time not spent stepping at `step` a step, by kind (seconds; with the steps
            # at that pace they add up to the wall time, to within one step).
            run["lost_seconds"] = {
                "start_and_end": round(run["wall_seconds"] - gaps["span_seconds"], 1),
                "recoveries_and_stalls": round(gaps["long_gaps_seconds"], 1),
                "steps_slower_than_the_pace": round(
                    gaps["short_gaps_seconds"] - step * gaps["short_gaps"], 1
                ),
            }
    return {
        "goodput": runs.get("in_place", {}).get("goodput"),
        "goodput_full_restart": runs.get("full_restart", {}).get("goodput"),
        "goodput_in_place_spare": runs.get("in_place_spare", {}).get("goodput"),
        "goal": 0.97,
        "paces_seconds": {name: round(pace, 6) for name, pace in paces.items()},
        # The trainer's own step time leaves out the loop around it (logging, the loss's all-reduce),
        # a sizable share of the demo model's short steps. Goodput by it, for comparison:
        "reference_compute_step_seconds": round(compute_step, 6),
        "goodput_by_compute_step": {
            path: round(run["steps"] * compute_step / run["wall_seconds"], 4) for path, run in runs.items()
        },
        "runs": runs,
    }


def records_since(log_text: str, since: float) -> dict[int, StepRecord]:
    """The kept steps of the events logged at or after `since` (epoch seconds): the dev node appends
    every pod of one name to one file, earlier benchmark runs' included."""

    def recent(line: str) -> bool:
        if not line.startswith("{"):
            return True  # attempt headers: an attempt with no recent event keeps no step
        try:
            stamp = json.loads(line).get("time")
            return datetime.fromisoformat(str(stamp)).timestamp() >= since
        except ValueError:
            return False

    return kept_steps(parse_trainer_log("\n".join(line for line in log_text.splitlines() if recent(line))))


def resummarize(result_file: Path, since: str) -> dict[str, Any]:
    """Recomputes the step figures of a finished run from its trainer logs (left in the dev node's
    state directory) and the wall times and steps in `result_file`."""
    from phalanx.devcluster.cluster import default_state_dir
    from phalanx.devcluster.realnode import agent_state_dir, real_node_names

    result = json.loads(result_file.read_text())
    logs = agent_state_dir(default_state_dir("bench-goodput"), real_node_names(1)[0]) / "logs"
    start = datetime.fromisoformat(since).timestamp()

    def steps_of(namespace: str) -> dict[int, StepRecord]:
        return records_since((logs / f"{namespace}_{JOB}-worker-0_trainer.log").read_text(), start)

    runs = {}
    for path, run in result["runs"].items():
        kept = steps_of(f"goodput-{path.replace('_', '-')}")
        keep = ("steps", "wall_seconds", "evictions", "restarts", "ledger")
        runs[path] = {**{k: run[k] for k in keep}, "in_run_step_seconds": wall_step(kept.values()),
                      "gaps": gap_profile(kept.values())}  # fmt: skip
    settings = ("minutes", "evict_every_seconds", "checkpoint_every_seconds", "checkpoint_interval_steps")
    return {
        "benchmark": "goodput",
        **summarize(steps_of("goodput-reference"), runs),
        **{k: result[k] for k in settings if k in result},
        "resummarized_from_logs_since": since,
        "machine_of_the_run": result.get("machine"),
        "run_measured_at": result.get("measured_at"),
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
    parser.add_argument("--resummarize-since", metavar="ISO_TIME",
                        help="run nothing: recompute --out's step figures from the logs of the run "
                        "that began at ISO_TIME (its trainer logs stay in the dev node's state directory)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.resummarize_since:
        write_result(args.out, resummarize(args.out, args.resummarize_since))
        print_table(json.loads(args.out.read_text()))
        return 0
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
        reference_records = reference_steps(reference, args.reference_steps, timeout=1800)
        step_seconds = wall_step(reference_records.values())
        if step_seconds is None:
            raise RuntimeError(f"the reference run logged too few steps; see {reference.out_dir}")
        steps = max(args.reference_steps, int(args.minutes * 60 / step_seconds))
        interval = max(1, round(args.checkpoint_every / step_seconds))
        say(f"reference step {step_seconds * 1000:.2f} ms: {steps} steps per job (~{args.minutes:.0f} min), "
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
            # What is measured survives a later path's failure.
            write_result(args.out.with_name(args.out.stem + ".partial.json"),
                         {"reference_step_seconds": step_seconds, "runs": runs})  # fmt: skip
    finally:
        reference.down()

    result = write_result(args.out, {
        "benchmark": "goodput",
        **summarize(reference_records, runs),
        "minutes": args.minutes,
        "evict_every_seconds": args.evict_every,
        "checkpoint_every_seconds": args.checkpoint_every,
        "checkpoint_interval_steps": interval,
    })  # fmt: skip
    print_table(result)
    say(f"wrote {args.out}")
    return 0


def print_table(result: Mapping[str, Any]) -> None:
    say(
        "paces (ms): "
        + ", ".join(f"{name} {pace * 1000:.2f}" for name, pace in result["paces_seconds"].items())
    )
    say(f"{'path':<14} {'goodput':>8} {'by ref.':>8} {'evictions':>9} {'wall s':>8}  lost s: start+end, "
        "recoveries+stalls, slower steps; operator's ratio")  # fmt: skip
    for path, run in result["runs"].items():
        ratio = (run["ledger"] or {}).get("ratio")
        lost = run.get("lost_seconds") or {}
        say(f"{path:<14} {run['goodput']:>8} {run['goodput_by_reference']:>8} {len(run['evictions']):>9} "
            f"{run['wall_seconds']:>8}  {lost.get('start_and_end')}, {lost.get('recoveries_and_stalls')}, "
            f"{lost.get('steps_slower_than_the_pace')}; {ratio}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
