"""The local control plane behaves like Kubernetes: scheduling, preemption, node loss, garbage collection."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from typing import Any

import pytest

from tests.conftest import Cluster, node_ready_status, silence_node, wait_for

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

    # Watch the victim from now on: the condition is set in the update that starts its deletion
    # (it then stays Terminating for its 30 s grace period, holding the GPUs the preemptor waits for).
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


# -- the harsh cases (docs/dev-cluster.md) ---------------------------------------------------------
def deleted_after(cluster: Cluster, ns: str, name: str, timeout: float) -> float:
    """Deletes the pod (without waiting) and returns the seconds until it was gone."""
    started = time.monotonic()
    cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false")
    wait_for(lambda: phase(cluster, ns, name) == "", timeout=timeout, interval=0.25, what=f"{name} gone")
    return time.monotonic() - started


def test_a_deleted_pod_stays_terminating_for_its_grace_period_unless_annotated_to_stop_sooner(
    cluster: Cluster, namespace: str
) -> None:
    slow = pod("slow", terminationGracePeriodSeconds=8)
    quick = pod("quick", terminationGracePeriodSeconds=60)
    quick["metadata"]["annotations"] = {"phalanx.dev/sim-terminate-after": "1s"}
    cluster.apply([slow, quick], namespace)
    for name in ("slow", "quick"):
        wait_for(lambda n=name: phase(cluster, namespace, n) == "Running", timeout=60, what=f"{name} Running")
    cluster.kubectl("delete", "pod", "slow", "-n", namespace, "--wait=false")
    time.sleep(4)
    terminating = cluster.get_json("pod", "slow", "-n", namespace)
    assert terminating["metadata"].get("deletionTimestamp") and terminating["status"]["phase"] == "Running"
    wait_for(
        lambda: phase(cluster, namespace, "slow") == "", timeout=20, what="slow pod gone after its grace"
    )
    assert deleted_after(cluster, namespace, "quick", timeout=20) < 10


def test_a_silenced_node_turns_unknown_and_tainted_and_its_deleted_pods_stay_terminating(
    cluster: Cluster, namespace: str, private_nodes: Any
) -> None:
    (node,) = private_nodes.add(1, gpus=8, prefix="silent")
    quick = pod("stuck", gpus=1, terminationGracePeriodSeconds=1, **private_nodes.placement())
    quick["metadata"]["annotations"] = {"phalanx.dev/sim-terminate-after": "1s"}
    cluster.apply(quick, namespace)
    wait_for(lambda: phase(cluster, namespace, "stuck") == "Running", timeout=60, what="pod Running")
    silence_node(cluster, node)
    wait_for(
        lambda: node_ready_status(cluster, node) == "Unknown", timeout=90, interval=2, what="node Unknown"
    )
    taints = {t["key"] for t in cluster.get_json("node", node)["spec"].get("taints") or []}
    assert "node.kubernetes.io/unreachable" in taints
    cluster.kubectl("delete", "pod", "stuck", "-n", namespace, "--wait=false")
    time.sleep(8)  # far past its grace period and its 1 s termination
    left = cluster.get_json("pod", "stuck", "-n", namespace)
    assert left["metadata"].get("deletionTimestamp"), "nobody should confirm the deletion"


def test_owner_references_need_the_right_to_update_the_owners_finalizers(
    cluster: Cluster, namespace: str
) -> None:
    """OwnerReferencesPermissionEnforcement: blockOwnerDeletion needs update on <owner>/finalizers."""
    account = f"writer-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    cluster.kubectl("create", "role", account, "-n", namespace, "--verb=get,create", "--resource=configmaps")
    cluster.kubectl("create", "rolebinding", account, "-n", namespace, f"--role={account}",
                    f"--serviceaccount={namespace}:{account}")  # fmt: skip
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace)
    uid = cluster.get_json("configmap", "owner", "-n", namespace)["metadata"]["uid"]

    def child(name: str, block: bool) -> str:
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": uid,
            "blockOwnerDeletion": block,
        }
        return json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "ownerReferences": [ref]}}
        )

    as_account = f"--as=system:serviceaccount:{namespace}:{account}"
    refused = cluster.kubectl(
        "create", "-f", "-", "-n", namespace, as_account, input=child("blocking", True), check=False
    )
    assert refused.returncode != 0 and "blockOwnerDeletion" in refused.stderr, refused.stderr
    cluster.kubectl("create", "-f", "-", "-n", namespace, as_account, input=child("plain", False))
