"""Node-loss benchmark (issue 16): an elastic gang that shrinks onto what is left, against a
fixed-size gang that waits for its lost node to come back, side by side in one run.

    python bench/node_loss_bench.py [--pairs 5] [--outage-seconds 120]

Brings up its own local cluster (kwok nodes, the real API server, scheduler and controller-manager)
and the operator. Each pair is two jobs of two 8-GPU pods, each job on its own two nodes and so
with no spare and no room elsewhere:
- elastic: spec.elastic {minReplicas 1, maxReplicas 2};
- fixed: replicas 2.
All jobs run at once. Then, in every job at the same moment, the node of worker-1 stops
heartbeating (its kwok Lease is taken away: the node turns Unknown after the controller-manager's
40 s grace, its pods stay as they are, tests/conftest.silence_node does the same). The fixed job's
node comes back after --outage-seconds (a reboot or a repaired partition); the elastic job's does
not. Per job: seconds from the loss to its next attempt running whole (every pod Running; the
elastic job at 1 pod). On kwok no trainer runs, so "training again" is "every pod of the new
attempt Running": what is left on a real cluster (the trainer's start and checkpoint load) is the
same on both sides. The result is shaped by the outage length chosen: the elastic side's time
does not depend on it, the fixed side's is at least it. Writes bench/results/node-loss.json and
prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gang_bench as gang  # a sibling script: python puts bench/ first on the path
from kubernetes import client
from result_file import write_result

from phalanx.constants import GROUP, LABEL_ATTEMPT, LABEL_JOB_NAME, PLURAL, VERSION
from phalanx.devcluster.cluster import LocalCluster, down_on_sigterm

RESULTS = Path(__file__).resolve().parent / "results" / "node-loss.json"
SILENCED_HOLDER = "phalanx-bench-silenced"
SIM_SILENCED = "phalanx.dev/sim-silenced"  # kwok plays no stage for these (kwok-stages.yaml)
NAMESPACE = "node-loss"


def job_manifest(name: str, pool: str, elastic: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resources": {"gpus": 8},
        "runPolicy": {"terminationGracePeriodSeconds": 1},
        "template": {
            "metadata": {"annotations": {"phalanx.dev/sim-run-for": "3600s"}},
            "spec": {
                "containers": [{"name": "trainer", "image": "trainer:bench"}],
                **gang.pool_placement(pool),
            },
        },
    }
    if elastic:
        spec["elastic"] = {"minReplicas": 1, "maxReplicas": 2}
    else:
        spec["replicas"] = 2
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


class Cluster:
    """The few reads and writes the benchmark makes, through one API client."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.leases: Any = client.CoordinationV1Api(api)

    def status(self, name: str) -> dict[str, Any]:
        job = self.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        return dict(job.get("status") or {})

    def pods(self, name: str, attempt: int) -> list[dict[str, Any]]:
        selector = f"{LABEL_JOB_NAME}={name},{LABEL_ATTEMPT}={attempt}"
        raw = self.core.list_namespaced_pod(NAMESPACE, label_selector=selector, _preload_content=False)
        return list(json.loads(raw.data)["items"])

    def running_whole(self, name: str, size: int, after_attempt: int = -1) -> int | None:
        """The attempt, once a later one than `after_attempt` runs with `size` pods all Running."""
        status = self.status(name)
        attempt = int(status.get("attempt") or 0)
        if attempt <= after_attempt or status.get("phase") != "Running":
            return None
        if status.get("currentReplicas", size) != size:
            return None
        pods = self.pods(name, attempt)
        running = len(pods) == size and all(p["status"].get("phase") == "Running" for p in pods)
        return attempt if running else None

    def node_of(self, name: str, attempt: int, index: int) -> str:
        pod = next(p for p in self.pods(name, attempt) if p["metadata"]["name"].endswith(f"-worker-{index}"))
        return str(pod["spec"]["nodeName"])

    def silence(self, node: str) -> dict[str, Any]:
        """Stops the node's heartbeats; returns what un-silencing restores."""
        lease = self.leases.read_namespaced_lease(node, "kube-node-lease")
        before = {
            "holderIdentity": lease.spec.holder_identity,
            "leaseDurationSeconds": lease.spec.lease_duration_seconds,
        }
        self.leases.patch_namespaced_lease(
            node,
            "kube-node-lease",
            {"spec": {"holderIdentity": SILENCED_HOLDER, "leaseDurationSeconds": 86400}},
        )
        self._annotate(node, "true")
        return before

    def restore(self, node: str, before: dict[str, Any]) -> None:
        self.leases.patch_namespaced_lease(node, "kube-node-lease", {"spec": before})
        self._annotate(node, None)

    def _annotate(self, node: str, value: str | None) -> None:
        patch = {"metadata": {"annotations": {SIM_SILENCED: value}}}
        self.core.patch_node(node, patch)
        raw = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        for pod in json.loads(raw.data)["items"]:
            try:
                self.core.patch_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"], patch)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


def wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value is not None:
            return value
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f}s: {what}")


def run_job(cluster: Cluster, name: str, elastic: bool, lost_at: float, outage: float, node: str,
            before: dict[str, Any], timeout: float, out: dict[str, Any]) -> None:  # fmt: skip
    """Waits for the job's next attempt to run whole after the loss at `lost_at` (monotonic)."""
    try:
        if not elastic:
            time.sleep(max(0.0, lost_at + outage - time.monotonic()))
            cluster.restore(node, before)
            gang.log(f"  {name}: node {node} back after {time.monotonic() - lost_at:.0f}s")
        size = 1 if elastic else 2
        wait(lambda: cluster.running_whole(name, size, after_attempt=0), timeout, f"{name} running at {size}")
        out["seconds"] = round(time.monotonic() - lost_at, 1)
        status = cluster.status(name)
        out["restarts"] = status.get("restarts")
        out["size"] = size
        gang.log(f"  {name}: running whole at {size} pod(s) {out['seconds']}s after the loss")
    except Exception as exc:  # noqa: BLE001 - reported in the result, the other jobs go on
        out["error"] = str(exc)
        gang.log(f"  {name}: {exc}")


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [r["seconds"] for r in runs if "seconds" in r]
    return {
        "jobs": len(runs),
        "recovered": len(seconds),
        "median_seconds": round(statistics.median(seconds), 1) if seconds else None,
        "spread_seconds": [min(seconds), max(seconds)] if seconds else None,
        "runs": runs,
    }


def table(result: dict[str, Any]) -> str:
    rows = [f"{'side':10} {'recovered':>10} {'median s':>9} {'min s':>7} {'max s':>7}", "-" * 48]
    for side in ("elastic", "fixed"):
        s = result[side]
        lo, hi = s["spread_seconds"] or (None, None)
        rows.append(
            f"{side:10} {s['recovered']:>4}/{s['jobs']:<5} {s['median_seconds']!s:>9} {lo!s:>7} {hi!s:>7}"
        )
    rows.append(
        f"elastic / fixed (medians): {result['elastic_over_fixed']}; outage {result['outage_seconds']} s"
    )
    return "\n".join(rows)


def main() -> int:
    down_on_sigterm()  # a killed run tears its cluster down
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="elastic and fixed jobs, one of each per pair")
    parser.add_argument(
        "--outage-seconds", type=float, default=120.0, help="until the fixed job's node returns"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="per wait, seconds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs: give at least 1")
    started = time.time()
    state_dir = Path(tempfile.mkdtemp(prefix="phalanx-bench-node-loss-"))
    local = LocalCluster(state_dir, log=gang.log)
    operator: gang.Operator | None = None
    result: dict[str, Any] = {"pairs": args.pairs, "outage_seconds": args.outage_seconds}
    try:
        names = [(f"elastic-{i}", True) for i in range(args.pairs)] + [
            (f"fixed-{i}", False) for i in range(args.pairs)
        ]
        pools = [gang.bench_pool(name, 2) for name, _ in names]
        kubeconfig, api = gang.start_bench_cluster(local, pools)
        cluster = Cluster(api)
        gang.create_namespace(cluster.core, NAMESPACE)
        operator = gang.Operator(kubeconfig, state_dir / "operator.log")
        for name, elastic in names:
            cluster.custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, job_manifest(name, name, elastic)
            )
        for name, _ in names:
            wait(lambda n=name: cluster.running_whole(n, 2), args.timeout, f"{name} running at 2")  # type: ignore[misc]
        gang.log(
            f"{len(names)} jobs running at 2 pods ({time.time() - started:.0f}s); losing worker-1's node in each"
        )
        lost: dict[str, tuple[str, dict[str, Any], float]] = {}
        for name, _ in names:
            node = cluster.node_of(name, 0, 1)
            before = cluster.silence(node)
            lost[name] = (node, before, time.monotonic())
        outs: dict[str, dict[str, Any]] = {name: {"job": name} for name, _ in names}
        threads = [
            threading.Thread(
                target=run_job,
                args=(
                    cluster,
                    name,
                    elastic,
                    lost[name][2],
                    args.outage_seconds,
                    lost[name][0],
                    lost[name][1],
                    args.timeout,
                    outs[name],
                ),
            )  # fmt: skip
            for name, elastic in names
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result["elastic"] = summary([outs[n] for n, e in names if e])
        result["fixed"] = summary([outs[n] for n, e in names if not e])
        medians = (result["elastic"]["median_seconds"], result["fixed"]["median_seconds"])
        result["elastic_over_fixed"] = round(medians[0] / medians[1], 3) if all(medians) else None
    finally:
        if operator is not None:
            operator.stop()
        local.down(quiet=True)
    result["wall_seconds"] = round(time.time() - started, 1)
    result["command"] = " ".join(["python", "bench/node_loss_bench.py", *sys.argv[1:]])
    write_result(args.out, result)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
