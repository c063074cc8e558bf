"""The local control plane behaves like Kubernetes: scheduling, preemption, node loss, garbage collection."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

import pytest

from tests.conftest import Cluster, wait_for

pytestmark = pytest.mark.integration


def pod(name: str, gpus: int = 0, priority_class: str | None = None, **spec: Any) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}], **spec},
    }
    if priority_class:
        body["spec"]["priorityClassName"] = priority_class
    return body


def phase(cluster: Cluster, ns: str, name: str) -> str:
    out = cluster.kubectl("get", "pod", name, "-n", ns, "-o", "jsonpath={.status.phase}", check=False)
    return out.stdout if out.returncode == 0 else ""


def test_server_reports_the_built_release(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.36.")
    assert version["clientVersion"]["gitVersion"] == version["serverVersion"]["gitVersion"]


def test_simulated_nodes_carry_gpu_and_mig_capacity(cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in cluster.get_json("nodes")["items"]}
    assert nodes["gpu-node-0"]["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert nodes["gpu-node-0"]["metadata"]["labels"]["nvidia.com/gpu.product"].startswith("NVIDIA-")
    assert nodes["mig-node-0"]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    assert nodes["mig-node-0"]["metadata"]["labels"]["nvidia.com/mig.strategy"] == "mixed"


def test_gpu_pod_is_bound_to_a_node_with_free_gpus_and_runs(cluster: Cluster, namespace: str) -> None:
    cluster.apply(pod("gpu", gpus=4), namespace)
    wait_for(lambda: phase(cluster, namespace, "gpu") == "Running", timeout=60, what="pod Running")
    bound = cluster.get_json("pod", "gpu", "-n", namespace)["spec"]["nodeName"]
    assert bound.startswith("gpu-node-")


def test_pod_asking_more_gpus_than_any_node_stays_pending_with_reason(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(pod("huge", gpus=64), namespace)

    def unschedulable() -> str:
        conds = cluster.get_json("pod", "huge", "-n", namespace).get("status", {}).get("conditions", [])
        return next(
            (c.get("message", "") for c in conds if c["type"] == "PodScheduled" and c["status"] == "False"),
            "",
        )

    message = wait_for(unschedulable, timeout=60, what="PodScheduled=False")
    assert "Insufficient nvidia.com/gpu" in message
    assert phase(cluster, namespace, "huge") == "Pending"


def test_higher_priority_pod_preempts_and_victim_gets_disruption_target(
    cluster: Cluster, namespace: str, private_nodes: Any
) -> None:
    private_nodes.add(1, gpus=8, prefix="prio")
    for name, value in (("low", 100), ("high", 100000)):
        cluster.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                       "metadata": {"name": f"{namespace}-{name}"}, "value": value})  # fmt: skip
    cluster.apply(
        pod("victim", gpus=8, priority_class=f"{namespace}-low", **private_nodes.placement()), namespace
    )
    wait_for(lambda: phase(cluster, namespace, "victim") == "Running", timeout=60, what="victim Running")

    # Watch the victim from now on: kwok removes a deleted pod at once, so the condition is seen
    # only in the update that precedes deletion.
    seen: list[dict[str, Any]] = []
    watcher = subprocess.Popen(
        [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "get", "pod", "victim",
         "-n", namespace, "--watch", "--output-watch-events", "-o", "json"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    reader = threading.Thread(target=_collect_json_stream, args=(watcher, seen), daemon=True)
    reader.start()
    try:
        cluster.apply(pod("preemptor", gpus=8, priority_class=f"{namespace}-high", **private_nodes.placement()),
                      namespace)  # fmt: skip
        wait_for(
            lambda: phase(cluster, namespace, "preemptor") == "Running", timeout=90, what="preemptor Running"
        )
    finally:
        watcher.terminate()
        reader.join(timeout=5)
        for name in ("low", "high"):
            cluster.kubectl("delete", "priorityclass", f"{namespace}-{name}", check=False)
    reasons = {
        c.get("reason")
        for event in seen
        for c in event["object"].get("status", {}).get("conditions", [])
        if c["type"] == "DisruptionTarget" and c["status"] == "True"
    }
    assert reasons & {"PreemptionByScheduler", "PreemptionByKubeScheduler"}, f"events seen: {len(seen)}"


def _collect_json_stream(proc: subprocess.Popen[str], out: list[dict[str, Any]]) -> None:
    decoder = json.JSONDecoder()
    buffer = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        buffer += line
        while buffer.strip():
            try:
                obj, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                break
            out.append(obj)
            buffer = buffer.lstrip()[end:]


def test_deleting_a_node_makes_controller_manager_remove_its_pods(
    cluster: Cluster, namespace: str, private_nodes: Any
) -> None:
    (node,) = private_nodes.add(1, gpus=8, prefix="doomed")
    cluster.apply(pod("orphan", gpus=1, **private_nodes.placement()), namespace)
    wait_for(lambda: phase(cluster, namespace, "orphan") == "Running", timeout=60, what="pod Running")
    cluster.kubectl("delete", "node", node)
    # The pod garbage collector removes pods bound to a node that no longer exists (after its
    # quarantine period, about 40 s).
    wait_for(lambda: phase(cluster, namespace, "orphan") in ("", "Failed"), timeout=150, interval=2,
             what="orphaned pod removed or failed")  # fmt: skip


def test_owner_reference_garbage_collection_deletes_children(cluster: Cluster, namespace: str) -> None:
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "parent"}}, namespace)
    uid = cluster.get_json("configmap", "parent", "-n", namespace)["metadata"]["uid"]
    child = pod("child")
    child["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": uid}
    ]
    cluster.apply(child, namespace)
    assert phase(cluster, namespace, "child") != ""
    cluster.kubectl("delete", "configmap", "parent", "-n", namespace)
    wait_for(lambda: phase(cluster, namespace, "child") == "", timeout=60, what="child garbage-collected")
