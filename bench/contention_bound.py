"""What the contention part's GPU utilization could be with no latency at all (the bound it is read
against): the same gangs, all waiting at t=0 on the same pool, admitted by the operator's own plan
(gang/admission.plan_admission, reservations carried from pass to pass) at the very instant a pod
finishes, each pod running exactly `run_seconds`. Utilization is computed as gang_bench.contention
computes it (GPU-seconds used until the last gang starts, over the pool's GPU-seconds until then).

What stays below 1.0 here is the policy's: whole gangs on whole nodes leave holes, and a blocked
head's reserved nodes idle while it waits for the rest of them. What the bench measures below this
bound is latency: seeing a pod finish, the pass, the writes, the scheduler, the kubelet (kwok).

    python bench/contention_bound.py --seeds 40    # the bound's spread over the bench's gang mixes
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Sequence

from phalanx.gang.admission import GangRequest, plan_admission
from phalanx.gang.capacity import NodeInfo, PodDemand

GPU = "nvidia.com/gpu"
GPUS_PER_NODE = 8


def _node(index: int) -> NodeInfo:
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(GPUS_PER_NODE)}
    return NodeInfo.from_k8s(
        {
            "metadata": {"name": f"node-{index:04d}"},
            "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
        }
    )


def zero_latency_utilization(
    gangs: Sequence[tuple[str, int, int]], pool_nodes: int, run_seconds: float, start_latency: float = 0.0
) -> float:
    """gangs: (name, pods, GPUs per pod) in submission order, as gang_bench.contention draws them.
    start_latency: seconds from a gang's admission to its pods running (its room held meanwhile):
    0 gives the bound, more shows what a given reaction time costs."""
    nodes = [_node(i) for i in range(pool_nodes)]
    requests: dict[str, tuple[GangRequest, int]] = {}
    for order, (name, size, gpus) in enumerate(gangs):
        demand = PodDemand.from_pod_spec(
            {"containers": [{"name": "trainer", "resources": {"limits": {GPU: str(gpus)}}}]}
        )
        pods = tuple((f"{name}-{p}", demand) for p in range(size))
        requests[name] = (GangRequest(key=f"bench/{name}", priority=0, created=order / 1000, pods=pods), gpus)
    used = {node.name: 0 for node in nodes}
    running: list[tuple[float, str, tuple[tuple[str, str], ...]]] = []  # (end, gang, placements)
    started: dict[str, float] = {}
    reservations: dict[str, tuple[str, ...]] = {}
    now = 0.0
    while len(started) < len(requests):
        waiting = [request for name, (request, _) in requests.items() if name not in started]
        held = {node: {GPU: gpus * 1000} for node, gpus in used.items() if gpus}
        plan = plan_admission(waiting, nodes, held, now, reservations=reservations)
        reservations = dict(plan.reservations)
        for admission in plan.admitted:
            name = admission.key.split("/", 1)[1]
            started[name] = now + start_latency
            for _, node in admission.placements:
                used[node] += requests[name][1]
            running.append((now + start_latency + run_seconds, name, admission.placements))
        if len(started) == len(requests):
            break
        if not running:
            raise RuntimeError(
                f"gangs {sorted(set(requests) - set(started))} can never fit {pool_nodes} nodes"
            )
        running.sort()
        now, name, placements = running.pop(0)
        for _, node in placements:
            used[node] -= requests[name][1]
    last_start = max(started.values())
    if last_start <= 0:
        return 1.0
    gpu_seconds = sum(
        requests[name][1] * len(requests[name][0].pods) * (min(start + run_seconds, last_start) - start)
        for name, start in started.items()
    )
    return gpu_seconds / (pool_nodes * GPUS_PER_NODE * last_start)


def main() -> None:
    from gang_bench import contention_gangs  # beside this script; it imports this module too

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument(
        "--nodes", type=int, default=32, help="the contention pool (gang_bench --contention-nodes)"
    )
    parser.add_argument("--run-seconds", type=float, default=20.0)
    parser.add_argument("--start-latency", type=float, default=0.0, help="admission to running, seconds")
    args = parser.parse_args()
    capacity = args.nodes * GPUS_PER_NODE
    bounds = sorted(
        zero_latency_utilization(
            contention_gangs(random.Random(seed), capacity), args.nodes, args.run_seconds, args.start_latency
        )
        for seed in range(args.seeds)
    )
    print(f"GPU utilization, starts {args.start_latency} s after admission, {args.seeds} gang mixes, "
          f"{args.nodes} nodes: median {statistics.median(bounds):.3f}, min {bounds[0]:.3f}, max {bounds[-1]:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
