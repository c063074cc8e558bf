"""What an admission pass pays, under the admission lock, to read when nodes free on a large busy
cluster: AdmissionPass._free_at over every node (the backfill and the head's reservation read it
when a blocked head holds room that idles, or a gang with an estimate waits) and early start's
outlook over a head's 64 nodes. This tree's operator against an earlier commit's, in one process
each, pairs alternating which side goes first (AB, BA, ...); nothing but Python runs, no cluster.

Not measured here: the work moved onto the watch thread (what a pass reads of a pod is taken as
the pod changes). The stores hold NODES nodes, each running PODS_PER_NODE pods of 8-pod TrainingJobs that state
their run time (Running, first attempt) and two DaemonSet agents: 5,000 nodes x 8 is 40,000 job
pods, 10,000 agents and 5,000 jobs.

    python bench/pass_reads_bench.py --baseline 0c4552e            # 5,000 nodes x 8, 5 pairs
    python bench/pass_reads_bench.py --baseline 0c4552e --nodes 1000 --pods-per-node 1
Results: bench/results/pass-reads.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from result_file import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "pass-reads.json"
GPU = "nvidia.com/gpu"
HEAD_NODES = 64  # what early start reads: the nodes a blocked head holds


def measure(nodes: int, per_node: int, calls: int) -> dict[str, float]:
    """Fills the stores and times the reads (CPU ms per call, median of `calls`) with whichever
    operator `phalanx` imports from (the side's PYTHONPATH)."""
    from phalanx.controller.admission_pass import AdmissionPass
    from phalanx.controller.admission_state import AdmissionState
    from phalanx.controller.stores import ClusterStores

    stores = ClusterStores()
    jobs = 0
    for n in range(nodes):
        for k in range(per_node):
            if (n * per_node + k) % 8 == 0:
                jobs += 1
                stores.jobs.upsert({
                    "metadata": {"name": f"j{jobs}", "namespace": "ns", "uid": f"u{jobs}", "resourceVersion": "1"},
                    "spec": {"replicas": 8, "scheduling": {"expectedRunSeconds": 3600}},
                    # Each its own start (a second apart): every pass reads the same strings again.
                    "status": {"phase": "Running", "startTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(
                        1767225600 + jobs))},
                })  # fmt: skip
            stores.pods.upsert({
                "metadata": {"name": f"j{jobs}-{n}-{k}", "namespace": "ns", "uid": f"p{n}-{k}", "resourceVersion": "1",
                             "labels": {"phalanx.dev/job-name": f"j{jobs}"},
                             "ownerReferences": [{"kind": "TrainingJob", "name": f"j{jobs}", "uid": f"u{jobs}",
                                                  "controller": True}]},
                "spec": {"nodeName": f"n{n}", "priority": 0,
                         "containers": [{"name": "c", "resources": {"requests": {GPU: str(8 // per_node), "cpu": "4"}}}]},
                "status": {"phase": "Running"},
            })  # fmt: skip
        for agent in ("dcgm", "cni"):
            stores.pods.upsert({
                "metadata": {"name": f"{agent}-{n}", "namespace": "kube-system", "uid": f"{agent}{n}",
                             "resourceVersion": "1",
                             "ownerReferences": [{"kind": "DaemonSet", "name": agent, "uid": agent, "controller": True}]},
                "spec": {"nodeName": f"n{n}", "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]},
                "status": {"phase": "Running"},
            })  # fmt: skip
    state = AdmissionState()
    passing = AdmissionPass(None, stores, state, None, None, None, None, time.time)  # type: ignore[arg-type]
    every = {f"n{n}" for n in range(nodes)}
    held = [f"n{n}" for n in range(min(HEAD_NODES, nodes))]
    now = time.time()
    free_at, outlook = [], []
    for _ in range(calls):
        began = time.process_time()
        ends = passing._free_at(every, state, now)
        free_at.append(time.process_time() - began)
        began = time.process_time()
        passing._early_start(state, now)(held)
        outlook.append(time.process_time() - began)
    if len(ends) != nodes:
        raise SystemExit(f"free_at read {len(ends)} of {nodes} nodes")
    return {
        "free_at_ms": statistics.median(free_at) * 1e3,
        "outlook_ms": statistics.median(outlook) * 1e3,
        "pods": nodes * (per_node + 2),
        "jobs": jobs,
    }


def side_run(operator_path: Path, nodes: int, per_node: int, calls: int) -> dict[str, float]:
    """One side in its own process, importing the operator from `operator_path`."""
    env = {**os.environ, "PYTHONPATH": str(operator_path)}
    command = [sys.executable, str(Path(__file__).resolve()), "--side",
               "--nodes", str(nodes), "--pods-per-node", str(per_node), "--calls", str(calls)]  # fmt: skip
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", help="side A's commit (required unless --side)")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=8, choices=(1, 2, 4, 8))
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument(
        "--calls", type=int, default=5, help="timed calls per run (their median is the run's)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)  # one side's run, JSON out
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(measure(args.nodes, args.pods_per_node, args.calls)))
        return 0
    if not args.baseline:
        parser.error("--baseline <commit> is required")
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="pass-reads-") as scratch:
        worktree = Path(scratch) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.baseline], cwd=REPO, check=True,
                       capture_output=True)  # fmt: skip
        try:
            paths = {"A": worktree / "operator", "B": REPO / "operator"}
            for pair in range(args.pairs):
                for side in ("A", "B") if pair % 2 == 0 else ("B", "A"):
                    runs[side].append(side_run(paths[side], args.nodes, args.pods_per_node, args.calls))
                a, b = runs["A"][-1], runs["B"][-1]
                print(f"[{time.strftime('%H:%M:%S')}] pair {pair + 1}/{args.pairs}: free_at A {a['free_at_ms']:.1f} ms, "
                      f"B {b['free_at_ms']:.1f} ms; outlook A {a['outlook_ms']:.2f} ms, B {b['outlook_ms']:.2f} ms",
                      file=sys.stderr, flush=True)  # fmt: skip
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False)

    def summary(metric: str) -> dict[str, Any]:
        a = [r[metric] for r in runs["A"]]
        b = [r[metric] for r in runs["B"]]
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        return {
            "A_ms": [round(x, 2) for x in a],
            "B_ms": [round(x, 2) for x in b],
            "A_median_ms": round(statistics.median(a), 2),
            "B_median_ms": round(statistics.median(b), 2),
            "ratio_B_vs_A_per_pair": [round(r, 3) for r in ratios],
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
        }

    head = git_head()
    result = {
        "what": "CPU ms per call of what a pass reads of when nodes free, under the admission lock",
        "nodes": args.nodes,
        "job_pods": args.nodes * args.pods_per_node,
        "pods": runs["B"][0]["pods"],
        "jobs": runs["B"][0]["jobs"],
        "side_A": args.baseline,
        "side_B": head,
        "pairs": args.pairs,
        "order": "ABBA: pairs alternate which side goes first; each run its own process",
        "free_at_every_node": summary("free_at_ms"),
        f"early_start_outlook_{HEAD_NODES}_nodes": summary("outlook_ms"),
        "command": " ".join(
            ["python", "bench/pass_reads_bench.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    write_result(args.out, result)
    free_at, outlook = result["free_at_every_node"], result[f"early_start_outlook_{HEAD_NODES}_nodes"]
    print(f"{'nodes / pods / jobs':<44}{args.nodes} / {result['pods']} / {result['jobs']}")
    print(
        f"{'_free_at, every node: A / B (median ms)':<44}{free_at['A_median_ms']} / {free_at['B_median_ms']}"
    )
    print(f"{'  ratio B / A (median, range)':<44}{free_at['ratio_median']} ({free_at['ratio_spread']})")
    print(f"{'outlook, 64 nodes: A / B (median ms)':<44}{outlook['A_median_ms']} / {outlook['B_median_ms']}")
    print(f"{'  ratio B / A (median, range)':<44}{outlook['ratio_median']} ({outlook['ratio_spread']})")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def git_head() -> str:
    """This tree's commit, "+changes" when its operator differs from it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "operator"], cwd=REPO, capture_output=True, text=True
    )
    return commit.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
