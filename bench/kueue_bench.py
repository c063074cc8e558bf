"""Phalanx beside Kueue, on one kwok cluster with a real Kueue (hack/kueue-bin.sh): the same gangs
submitted three ways, side by side in the same run.

- (a) builtin: TrainingJobs admitted by Phalanx's own gang admission;
- (b) phalanx_kueue: the same TrainingJobs labelled kueue.x-k8s.io/queue-name, admitted by Kueue
  through the Workload each job owns (docs/kueue.md);
- (c) kueue_pod_group: the very pods the operator builds (bench/gang_bench.direct_pod), created
  directly as one Kueue pod group per gang (label kueue.x-k8s.io/pod-group-name, annotation
  pod-group-total-count): Kueue's own all-or-nothing admission, its pod integration.

Admission rounds: each round submits one random list of gangs (4-32 pods x 1 GPU, all fitting at
once) to each side in turn, the order rotating round by round (abc, bca, cab, ...) because this
machine's load swings; each side starts on a quiet cluster. Latency is the gang's first object
created -> all its pods Running, seen through a watch. Contention: gangs asking about twice a
dedicated pool's GPUs, per side, pods finishing after a fixed time; GPU utilization while work
waited (bench/gang_bench.contention). The ClusterQueues' GPU quota is each pool's GPUs.

    make bench-kueue                                   # writes bench/results/kueue.json, prints a table
    python bench/kueue_bench.py --nodes 50 --rounds 2 --jobs-per-round 8 --parts admission   # a look
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gang_bench as gang  # a sibling script: python puts bench/ first on the path
from kubernetes import client
from result_file import write_result

from phalanx.devcluster.cluster import LocalCluster, down_on_sigterm
from phalanx.devcluster.kueue import resolve_kueue_dir, start_kueue
from phalanx.k8s import release

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "kueue.json"
KUEUE = "kueue.x-k8s.io"
QUEUE_LABEL = f"{KUEUE}/queue-name"
POD_GROUP_LABEL = f"{KUEUE}/pod-group-name"
POD_GROUP_COUNT = f"{KUEUE}/pod-group-total-count"
LOCAL_QUEUE = "bench"
SIDES = ("builtin", "phalanx_kueue", "kueue_pod_group")
GOALS = {"builtin_over_pod_group": 0.8, "phalanx_kueue_over_pod_group": 1.1}
log = gang.log


def kueue_queues(cluster: LocalCluster, pools: dict[str, int]) -> None:
    """One flavor, and a ClusterQueue per pool with that pool's GPUs as quota (cpu and memory
    covered generously: the bench's pods ask for GPUs only)."""
    docs: list[dict[str, Any]] = [
        {"apiVersion": f"{KUEUE}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "bench"}}
    ]
    for pool, nodes in pools.items():
        quota = [{"name": "cpu", "nominalQuota": "100000"}, {"name": "memory", "nominalQuota": "100000Gi"},
                 {"name": "nvidia.com/gpu", "nominalQuota": str(nodes * 8)}]  # fmt: skip
        docs.append({
            "apiVersion": f"{KUEUE}/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"bench-{pool}"},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": "bench", "resources": quota}]}]},
        })  # fmt: skip
    cluster.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


def local_queue(custom: Any, pool: str) -> Callable[[str], None]:
    def prepare(ns: str) -> None:
        body = {"apiVersion": f"{KUEUE}/v1beta2", "kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE},
                "spec": {"clusterQueue": f"bench-{pool}"}}  # fmt: skip
        custom.create_namespaced_custom_object(KUEUE, "v1beta2", ns, "localqueues", body)

    return prepare


def submit_queued_training_job(api: client.ApiClient) -> gang.Submit:
    custom = client.CustomObjectsApi(api)

    def submit(ns: str, name: str, size: int, gpus: int, run_for: str, placement: dict[str, Any]) -> None:
        job = gang.training_job(name, size, gpus, run_for, placement)
        job["metadata"]["labels"] = {QUEUE_LABEL: LOCAL_QUEUE}
        custom.create_namespaced_custom_object(gang.GROUP, gang.VERSION, ns, gang.PLURAL, job)

    return submit


def submit_pod_group(api: client.ApiClient) -> gang.Submit:
    core: Any = client.CoreV1Api(api)

    def submit(ns: str, name: str, size: int, gpus: int, run_for: str, placement: dict[str, Any]) -> None:
        release(core.create_namespaced_service(
            ns, gang.direct_service(ns, name, size, gpus, run_for, placement), _preload_content=False))  # fmt: skip
        for index in range(size):
            pod = gang.direct_pod(ns, name, index, size, gpus, run_for, placement)
            pod["metadata"]["labels"].update({QUEUE_LABEL: LOCAL_QUEUE, POD_GROUP_LABEL: name})
            pod["metadata"].setdefault("annotations", {})[POD_GROUP_COUNT] = str(size)
            release(core.create_namespaced_pod(ns, pod, _preload_content=False))

    return submit


def side_runner(api: client.ApiClient, side: str) -> tuple[gang.Submit, str]:
    """How a side submits one gang, and the label its pods carry."""
    if side == "builtin":
        return gang.submit_training_job(api), gang.JOB_LABEL
    if side == "phalanx_kueue":
        return submit_queued_training_job(api), gang.JOB_LABEL
    return submit_pod_group(api), gang.BASELINE_LABEL


def admission_rounds(api: client.ApiClient, rounds: int, jobs_per_round: int, rng: random.Random,
                     timeout: float) -> dict[str, Any]:  # fmt: skip
    core: Any = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    placement = gang.pool_placement("main")
    results: dict[str, list[gang.SideResult]] = {side: [] for side in SIDES}
    for r in range(-1, rounds):  # round -1: one unmeasured warm-up round of every side
        size = jobs_per_round if r >= 0 else min(jobs_per_round, gang.WARMUP_JOBS)
        gangs = [(f"g{r + 1}-{i}", rng.randint(4, 32)) for i in range(size)]
        order = SIDES[r % 3 :] + SIDES[: r % 3]
        for side in order:
            submit, label = side_runner(api, side)
            ns = f"kq-{side.replace('_', '-')}-{r + 1}"
            gang.create_namespace(core, ns)
            if side != "builtin":
                local_queue(custom, "main")(ns)
            what = "warm-up (not measured)" if r < 0 else f"round {r + 1}/{rounds}"
            log(f"{what}, {side}: {len(gangs)} gangs, {sum(s for _, s in gangs)} pods")

            def one(name: str, pods: int, submit: gang.Submit = submit, ns: str = ns) -> None:
                submit(ns, name, pods, 1, "15s", placement)

            result = gang.run_side(api, ns, gangs, label, one, timeout)
            log(f"  {side}: {result.pods} pods in {result.seconds:.1f}s "
                f"({result.pods / result.seconds:.0f} pods/s), p50 {gang.percentile(result.latencies, 0.5):.1f}s")  # fmt: skip
            if r >= 0:
                results[side].append(result)
            gang.wait_pods_finished(core, [ns])
            gang.delete_namespace(core, ns)
    return summarize(results)


def summarize(results: dict[str, list[gang.SideResult]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, runs in results.items():
        latencies = [x for run in runs for x in run.latencies]
        pods, seconds = sum(r.pods for r in runs), sum(r.seconds for r in runs)
        out[side] = {
            "jobs": len(latencies),
            "pods": pods,
            "p50_seconds": round(gang.percentile(latencies, 0.5), 2),
            "p99_seconds": round(gang.percentile(latencies, 0.99), 2),
            "pods_per_second": round(pods / seconds, 1) if seconds else None,
            "per_round_seconds": [round(r.seconds, 1) for r in runs],
            "per_round_p50_seconds": [round(gang.percentile(r.latencies, 0.5), 2) for r in runs],
        }
    pod_group = results["kueue_pod_group"]
    for side in ("builtin", "phalanx_kueue"):
        # Per round: a side's time for all its gangs over the pod groups' time for the same gangs.
        ratios = [a.seconds / c.seconds for a, c in zip(results[side], pod_group, strict=True)]
        p50_ratios = [
            gang.percentile(a.latencies, 0.5) / gang.percentile(c.latencies, 0.5)
            for a, c in zip(results[side], pod_group, strict=True)
        ]
        key = f"{side}_over_pod_group"
        out[key] = {
            "median": round(statistics.median(ratios), 3) if ratios else None,
            "spread": [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None,
            "per_round": [round(x, 3) for x in ratios],
            "p50_latency_median": round(statistics.median(p50_ratios), 3) if p50_ratios else None,
            "goal": GOALS[key],
        }
    out["order"] = "rounds rotate the sides' order (abc, bca, cab); each side starts on a quiet cluster"
    return out


def contention_sides(api: client.ApiClient, pool_nodes: int, run_seconds: int, seed: int,
                     timeout: float) -> dict[str, Any]:  # fmt: skip
    custom = client.CustomObjectsApi(api)
    out = {}
    for side in SIDES:
        submit, label = side_runner(api, side)
        prepare = None if side == "builtin" else local_queue(custom, "contention")
        log(f"contention, {side}")
        # The same gangs for every side: the same seed.
        out[side] = gang.contention(api, pool_nodes, run_seconds, random.Random(seed), 300, timeout,
                                    submit=submit, label=label, ns=f"kq-contention-{side.replace('_', '-')}",
                                    prepare=prepare)  # fmt: skip
        gang.wait_pods_finished(client.CoreV1Api(api), [f"kq-contention-{side.replace('_', '-')}"])
    return out


def table(results: dict[str, Any]) -> str:
    rows = [("side", "p50 s", "p99 s", "pods/s", "utilization at 2x")]
    admission, contended = results.get("admission") or {}, results.get("contention") or {}
    for side in SIDES:
        a, c = admission.get(side) or {}, contended.get(side) or {}
        rows.append((side, str(a.get("p50_seconds", "-")), str(a.get("p99_seconds", "-")),
                     str(a.get("pods_per_second", "-")), str(c.get("gpu_utilization", "-"))))  # fmt: skip
    for key, goal in GOALS.items():
        ratio = admission.get(key) or {}
        rows.append(
            (key, f"median {ratio.get('median')}", f"spread {ratio.get('spread')}", f"goal <= {goal}", "")
        )
    width = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(width[i]) for i, cell in enumerate(row)) for row in rows)


def main() -> int:
    down_on_sigterm()  # a killed run tears its cluster down
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500, help="main pool: nodes x 8 GPUs")
    parser.add_argument("--contention-nodes", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds, each side once per round")
    parser.add_argument("--jobs-per-round", type=int, default=50)
    parser.add_argument("--contention-run-seconds", type=int, default=20)
    parser.add_argument("--parts", default="admission,contention")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=300, help="per wait, seconds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    resolve_kueue_dir()  # a clear error naming `make kueue-bin` before a cluster starts
    started = time.time()
    state_dir = Path(tempfile.mkdtemp(prefix="phalanx-bench-kueue-"))
    cluster = LocalCluster(state_dir, log=log)
    operator: gang.Operator | None = None
    results: dict[str, Any] = {"nodes": args.nodes, "seed": args.seed}
    try:
        pools = [gang.bench_pool("main", args.nodes), gang.bench_pool("contention", args.contention_nodes)]
        kubeconfig, api = gang.start_bench_cluster(cluster, pools)
        start_kueue(cluster)
        kueue_queues(cluster, {"main": args.nodes, "contention": args.contention_nodes})
        operator = gang.Operator(kubeconfig, state_dir / "operator.log")
        log(f"cluster, Kueue and operator ready ({time.time() - started:.0f}s); logs in {state_dir}")
        parts = set(args.parts.split(","))
        if "admission" in parts:
            results["admission"] = admission_rounds(api, args.rounds, args.jobs_per_round,
                                                    random.Random(args.seed), args.timeout)  # fmt: skip
            gang.save_partial(args.out, results)
        if "contention" in parts:
            results["contention"] = contention_sides(api, args.contention_nodes, args.contention_run_seconds,
                                                     args.seed, args.timeout)  # fmt: skip
    finally:
        if operator is not None:
            operator.stop()
        cluster.down(quiet=True)
    results["wall_seconds"] = round(time.time() - started, 1)
    results["command"] = " ".join(["python", "bench/kueue_bench.py", *sys.argv[1:]])
    write_result(args.out, results)
    args.out.with_suffix(".partial.json").unlink(missing_ok=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
