"""External gang schedulers: the PodGroup Phalanx creates for Volcano and for scheduler-plugins'
coscheduling, stored by the real API server through minimal CRDs (tests/data/crds). Neither scheduler
runs here, so the pods stay Pending: the tests check what those schedulers would read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.jobs import training_job

pytestmark = pytest.mark.integration

CRDS = Path(__file__).resolve().parents[1] / "data" / "crds"


@pytest.fixture(scope="module")
def podgroup_crds(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", str(CRDS))
    from phalanx.devcluster.crds import wait_established

    wait_established([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"],
                     ["podgroups.scheduling.volcano.sh", "podgroups.scheduling.x-k8s.io"])  # fmt: skip


def podgroup(cluster: Cluster, resource: str, ns: str, name: str) -> dict[str, Any] | None:
    found = cluster.kubectl("get", resource, name, "-n", ns, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(found.stdout)
    return obj


def job_pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json("pods", "-n", ns, "-l", f"phalanx.dev/job-name={name}")[
        "items"
    ]
    return items


def assert_deleted_with_the_job(cluster: Cluster, resource: str, ns: str, name: str) -> None:
    cluster.kubectl("delete", "tj", name, "-n", ns, "--wait=false")
    wait_for(lambda: podgroup(cluster, resource, ns, name) is None, timeout=45,
             what=f"{resource} {name} garbage-collected with its TrainingJob")  # fmt: skip


def test_volcano_job_gets_a_podgroup_and_pods_for_the_volcano_scheduler(
    cluster: Cluster, namespace: str, operator: OperatorProcess, podgroup_crds: None
) -> None:
    job = training_job("vc", replicas=3, gpus=4, scheduling={"provider": "volcano", "queue": "research"})
    cluster.apply(job, namespace)
    group = wait_for(lambda: podgroup(cluster, "podgroups.scheduling.volcano.sh", namespace, "vc"),
                     timeout=30, what="Volcano PodGroup")  # fmt: skip
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": 3, "queue": "research", "minResources": {"nvidia.com/gpu": "12"}}
    uid = cluster.get_json("tj", "vc", "-n", namespace)["metadata"]["uid"]
    (owner,) = group["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingJob", uid, True)
    assert group["metadata"]["labels"]["phalanx.dev/job-name"] == "vc"

    pods = wait_for(
        lambda: len(p := job_pods(cluster, namespace, "vc")) == 3 and p, timeout=30, what="3 pods"
    )
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "vc"
        assert not pod["spec"].get("schedulingGates"), "an external scheduler gangs: no Phalanx gate"
        assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    assert_deleted_with_the_job(cluster, "podgroups.scheduling.volcano.sh", namespace, "vc")


def test_coscheduling_job_gets_a_podgroup_label_and_scheduler_name(
    cluster: Cluster, namespace: str, operator: OperatorProcess, podgroup_crds: None
) -> None:
    job = training_job("co", replicas=4, gpus=2,
                       scheduling={"provider": "coscheduling", "gang": {"minAvailable": 4, "timeoutSeconds": 90}})  # fmt: skip
    cluster.apply(job, namespace)
    group = wait_for(lambda: podgroup(cluster, "podgroups.scheduling.x-k8s.io", namespace, "co"),
                     timeout=30, what="coscheduling PodGroup")  # fmt: skip
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {
        "minMember": 4,
        "scheduleTimeoutSeconds": 90,
        "minResources": {"nvidia.com/gpu": "8"},
    }
    assert group["metadata"]["ownerReferences"][0]["name"] == "co"

    pods = wait_for(
        lambda: len(p := job_pods(cluster, namespace, "co")) == 4 and p, timeout=30, what="4 pods"
    )
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "co"
        assert not pod["spec"].get("schedulingGates")
        assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    assert_deleted_with_the_job(cluster, "podgroups.scheduling.x-k8s.io", namespace, "co")


def test_provider_none_creates_plain_pods_and_no_podgroup(
    cluster: Cluster, namespace: str, operator: OperatorProcess, podgroup_crds: None
) -> None:
    cluster.apply(training_job("plain", replicas=2, gpus=1, scheduling={"provider": "none"}), namespace)
    pods = wait_for(
        lambda: len(p := job_pods(cluster, namespace, "plain")) == 2 and p, timeout=30, what="pods"
    )
    for pod in pods:
        assert pod["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
        assert not pod["spec"].get("schedulingGates")
    assert podgroup(cluster, "podgroups.scheduling.volcano.sh", namespace, "plain") is None
    assert podgroup(cluster, "podgroups.scheduling.x-k8s.io", namespace, "plain") is None
