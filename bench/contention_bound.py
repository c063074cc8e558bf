"""What the contention part's GPU utilization could be with no latency at all (the bound it is read
against): the same gangs, all waiting at t=0 on the same pool, admitted by the operator's own plan
(gang/admission.plan_admission, reservations carried from pass to pass) at the very instant pods
start or finish, each pod running exactly `run_seconds`; gangs that state their run time (the
bench's measured part) let the plan read when each node's work ends, as the operator does.
Utilization is computed as gang_bench.contention computes it (GPU-seconds used until the last gang
starts, over the pool's GPU-seconds until then).

What stays below 1.0 here is the policy's: whole gangs on whole nodes leave holes, and a blocked
head's reserved nodes idle while it waits for the rest of them unless some gang ends in time. What the bench measures below this
bound is latency: seeing a pod finish, the pass, the writes, the scheduler, the kubelet (kwok).

    python bench/contention_bound.py --seeds 40    # the bound's spread over the bench's gang mixes
"""

from __future__ import annotations

import argparse
import heapq
import math
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
    gangs: Sequence[tuple[str, int, int]],
    pool_nodes: int,
    run_seconds: float,
    start_latency: float = 0.0,
    stated: bool = True,
) -> float:
    """gangs: (name, pods, GPUs per pod) in submission order, as gang_bench.contention draws them.
    start_latency: seconds from a gang's admission to its pods running (its room held meanwhile):
    0 gives the bound, more shows what a given reaction time costs.
    stated: the gangs say how long they run (spec.scheduling.expectedRunSeconds), so the plan reads
    when each node's work ends (free_at), as the operator does for them; else it knows no end."""
    nodes = [_node(i) for i in range(pool_nodes)]
    requests: dict[str, tuple[GangRequest, int]] = {}
    for order, (name, size, gpus) in enumerate(gangs):
        demand = PodDemand.from_pod_spec(
            {"containers": [{"name": "trainer", "resources": {"limits": {GPU: str(gpus)}}}]}
        )
        pods = tuple((f"{name}-{p}", demand) for p in range(size))
        estimate = float(run_seconds) if stated else None
        request = GangRequest(
            key=f"bench/{name}", priority=0, created=order / 1000, pods=pods, estimate_seconds=estimate
        )
        requests[name] = (request, gpus)
    used = {node.name: 0 for node in nodes}
    placements: dict[str, tuple[tuple[str, str], ...]] = {}
    started: dict[str, float] = {}
    reservations: dict[str, tuple[str, ...]] = {}
    # (time, what, gang): a gang's pods start running, or end; a pass follows each instant's events,
    # as the operator's follows the pod changes it sees.
    events: list[tuple[float, str, str]] = [(0.0, "pass", "")]
    while events:
        now, what, name = heapq.heappop(events)
        if what == "start":
            started[name] = now
            heapq.heappush(events, (now + run_seconds, "end", name))
        elif what == "end":
            for _, node in placements[name]:
                used[node] -= requests[name][1]
        if events and events[0][0] == now:
            continue
        waiting = [request for name, (request, _) in requests.items() if name not in placements]
        if not waiting:
            continue
        held = {node: {GPU: gpus * 1000} for node, gpus in used.items() if gpus}
        free_at: dict[str, float] | None = None
        if stated:
            free_at = {}
            for gang, where in placements.items():
                begun = started.get(gang)
                end = math.inf if begun is None else begun + run_seconds
                if end > now:
                    for _, node in where:
                        free_at[node] = max(free_at.get(node, now), end)
        plan = plan_admission(waiting, nodes, held, now, reservations=reservations, free_at=free_at)
        reservations = dict(plan.reservations)
        for admission in plan.admitted:
            name = admission.key.split("/", 1)[1]
            placements[name] = admission.placements
            for _, node in admission.placements:
                used[node] += requests[name][1]
            heapq.heappush(events, (now + start_latency, "start", name))
    if len(placements) < len(requests):
        raise RuntimeError(
            f"gangs {sorted(set(requests) - set(placements))} can never fit {pool_nodes} nodes"
        )
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
    parser.add_argument("--unstated", action="store_true", help="the gangs do not say how long they run")
    args = parser.parse_args()
    capacity = args.nodes * GPUS_PER_NODE
    bounds = sorted(
        zero_latency_utilization(
            contention_gangs(random.Random(seed), capacity),
            args.nodes,
            args.run_seconds,
            args.start_latency,
            stated=not args.unstated,
        )
        for seed in range(args.seeds)
    )
    print(f"GPU utilization, starts {args.start_latency} s after admission, {args.seeds} gang mixes, "
          f"run times {'not ' if args.unstated else ''}stated, "
          f"{args.nodes} nodes: median {statistics.median(bounds):.3f}, min {bounds[0]:.3f}, max {bounds[-1]:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
