"""The CPU cost of one admission-at-creation decision (gang/on_creation.plan_on_creation) on a large
cluster: the nodes read afresh for each decision (NodeInfoCache.infos, as before the NodeSet) against
the one NodeSet every decision shares while no node changes (NodeInfoCache.node_set).

Both sides decide the same gangs (4-32 pods x 1 GPU) against the same room held on half the nodes,
in interleaved pairs (A, B, B, A, ...), each side timing a batch of decisions; the ratio is B over A
per pair, with the median and range. Nothing but the Python process runs: no cluster.

    python bench/decision_bench.py                       # 500 nodes, 7 pairs
    python bench/decision_bench.py --nodes 5000 --pairs 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from phalanx.gang.admission import GangRequest
from phalanx.gang.capacity import NodeInfo, NodeInfoCache, PodDemand
from phalanx.gang.on_creation import plan_on_creation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from result_file import write_result  # noqa: E402

GPU = "nvidia.com/gpu"
RESULTS = Path(__file__).resolve().parent / "results" / "decision.json"
POOL = "bench.phalanx.dev/pool"


def node_manifest(index: int) -> dict[str, Any]:
    """A node as the pod store holds it: labelled and tainted for its pool, like the gang bench's."""
    return {
        "metadata": {"name": f"main-{index:05d}", "labels": {POOL: "main"}},
        "spec": {"taints": [{"key": POOL, "value": "main", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gang_demand() -> PodDemand:
    return PodDemand.from_pod_spec({
        "nodeSelector": {POOL: "main"},
        "tolerations": [{"key": POOL, "operator": "Equal", "value": "main", "effect": "NoSchedule"}],
        "containers": [{"name": "trainer", "resources": {"limits": {GPU: "1"}, "requests": {"cpu": "1"}}}],
    })  # fmt: skip


def time_batch(
    read_nodes: Callable[[], Sequence[NodeInfo]],
    gangs: Sequence[GangRequest],
    used: dict[str, dict[str, int]],
) -> float:
    """Seconds per decision over the batch, the nodes read as the operator reads them each time."""
    started = time.process_time()
    for request in gangs:
        placements = plan_on_creation(
            request, read_nodes(), {k: dict(v) for k, v in used.items()}, False, 0.0
        )
        if placements is None:
            raise SystemExit(f"{request.key} did not fit: the bench's cluster is too small")
    return (time.process_time() - started) / len(gangs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--decisions", type=int, default=200, help="decisions per side per pair")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    nodes = [node_manifest(i) for i in range(args.nodes)]
    used = {
        f"main-{i:05d}": {GPU: 1000 * rng.randint(1, 7)}
        for i in rng.sample(range(args.nodes), args.nodes // 2)
    }
    demand = gang_demand()
    gangs = [
        GangRequest(
            f"ns/g{i}", 0, 0.0, tuple((f"g{i}-worker-{k}", demand) for k in range(size)), min_available=size
        )
        for i, size in enumerate(rng.randint(4, 32) for _ in range(args.decisions))
    ]
    fresh_cache, shared_cache = NodeInfoCache(), NodeInfoCache()
    sides: dict[str, Callable[[], Sequence[NodeInfo]]] = {
        "fresh": lambda: fresh_cache.infos(nodes),  # A: every decision scans every node
        "shared": lambda: shared_cache.node_set(nodes),  # B: one NodeSet while no node changes
    }
    for read in sides.values():
        time_batch(read, gangs[:10], used)  # warm both caches: the operator's are warm too
    per_side: dict[str, list[float]] = {"fresh": [], "shared": []}
    for pair in range(args.pairs):
        order = ("fresh", "shared") if pair % 2 == 0 else ("shared", "fresh")
        for side in order:
            per_side[side].append(time_batch(sides[side], gangs, used))
        print(f"pair {pair + 1}/{args.pairs}: fresh {per_side['fresh'][-1] * 1e3:.2f} ms, "
              f"shared {per_side['shared'][-1] * 1e3:.2f} ms per decision", file=sys.stderr)  # fmt: skip
    ratios = [b / a for a, b in zip(per_side["fresh"], per_side["shared"], strict=True)]
    result = {
        "nodes": args.nodes,
        "decisions_per_side_per_pair": args.decisions,
        "pairs": args.pairs,
        "order": "ABBA: pairs alternate which side goes first",
        "ms_per_decision_fresh": [round(x * 1e3, 3) for x in per_side["fresh"]],
        "ms_per_decision_shared": [round(x * 1e3, 3) for x in per_side["shared"]],
        "median_ms_fresh": round(statistics.median(per_side["fresh"]) * 1e3, 3),
        "median_ms_shared": round(statistics.median(per_side["shared"]) * 1e3, 3),
        "ratio_shared_vs_fresh_per_pair": [round(r, 3) for r in ratios],
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "command": " ".join(
            ["python", "bench/decision_bench.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    write_result(args.out, result)
    print(f"{'nodes':<34}{args.nodes}")
    print(
        f"{'ms per decision: fresh / shared':<34}{result['median_ms_fresh']} / {result['median_ms_shared']}"
    )
    print(f"{'ratio shared / fresh (median)':<34}{result['ratio_median']} (range {result['ratio_spread']})")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
