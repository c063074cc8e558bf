"""A real Kueue (hack/kueue-bin.sh, sigs.k8s.io/kueue) against the local control plane.

The manager runs as a local process; the API server calls its webhooks at 127.0.0.1 with the dev
cluster's CA. What these tests show is Kueue's own behaviour through that path: its webhook suspends
a queued Job on creation; a ClusterQueue with quota for one Job admits one and keeps the other
pending with Kueue's reason until the first has finished; a plain pod group is admitted all at once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from phalanx.devcluster.kueue import (
    QUEUE_NAME_LABEL,
    KueueState,
)
from tests.conftest import Cluster, wait_for

pytestmark = pytest.mark.integration

# kwok-stages.yaml: a pod finishes this long after it runs / is removed this long after its deletion.
SIM_RUN_FOR = "phalanx.dev/sim-run-for"
SIM_TERMINATE_AFTER = "phalanx.dev/sim-terminate-after"


@pytest.fixture
def queues(cluster: Cluster, namespace: str, kueue: KueueState) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue with quota for one 1-CPU Job, and a LocalQueue; yields its name."""
    tag = uuid.uuid4().hex[:6]
    flavor, cq, lq = f"flavor-{tag}", f"cq-{tag}", "lq"
    cluster.apply([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
             {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "1"}]}]}]}},
    ])  # fmt: skip
    cluster.apply(
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": lq},
         "spec": {"clusterQueue": cq}}, namespace=namespace,
    )  # fmt: skip
    wait_for(lambda: condition(cluster.get_json("clusterqueue", cq), "Active") == "True", timeout=30,
             what=f"ClusterQueue {cq} Active")  # fmt: skip
    try:
        yield lq
    finally:
        # While Kueue runs: its finalizers on workloads and queues are removed only by Kueue.
        cluster.kubectl(
            "delete", "jobs", "--all", "-n", namespace, "--cascade=foreground", "--timeout=60s", check=False
        )
        cluster.kubectl(
            "delete", "workloads.kueue.x-k8s.io", "--all", "-n", namespace, "--timeout=30s", check=False
        )
        cluster.kubectl("delete", "localqueue", lq, "-n", namespace, "--timeout=30s", check=False)
        cluster.kubectl("delete", "clusterqueue", cq, "--timeout=30s", check=False)
        cluster.kubectl("delete", "resourceflavor", flavor, "--timeout=30s", check=False)


def queued_job(name: str, queue: str, cpu: str = "1", suspend: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_NAME_LABEL: queue}},
        "spec": {
            "suspend": suspend,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                # removed at once when deleted, not after the default 30 s grace: a quick clean-up
                "metadata": {"annotations": {SIM_TERMINATE_AFTER: "0s"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
                    ],
                },
            },
        },
    }


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return str(c["status"])
    return None


def workload_of(cluster: Cluster, namespace: str, job: str) -> dict[str, Any] | None:
    for wl in cluster.get_json("workloads.kueue.x-k8s.io", "-n", namespace)["items"]:
        if any(
            ref["kind"] == "Job" and ref["name"] == job for ref in wl["metadata"].get("ownerReferences", [])
        ):
            return dict(wl)
    return None


def job_suspended(cluster: Cluster, namespace: str, job: str) -> bool:
    return bool(cluster.get_json("job", job, "-n", namespace)["spec"].get("suspend"))


def test_kueue_webhook_suspends_a_queued_job_on_creation(
    cluster: Cluster, namespace: str, queues: str
) -> None:
    # Created running; Kueue's mutating webhook (called by the API server at 127.0.0.1) suspends it.
    created = cluster.kubectl(
        "create", "-n", namespace, "-f", "-", "-o", "json",
        input=json.dumps(queued_job("born-running", queues, suspend=False)),
    )  # fmt: skip
    assert json.loads(created.stdout)["spec"]["suspend"] is True


def test_quota_for_one_job_admits_one_and_queues_the_other_until_it_finishes(
    cluster: Cluster, namespace: str, queues: str
) -> None:
    cluster.apply(queued_job("first", queues), namespace=namespace)
    first = wait_for(
        lambda: (wl := workload_of(cluster, namespace, "first")) and condition(wl, "Admitted") == "True" and wl,
        timeout=30, what="the first Job's Workload Admitted",
    )  # fmt: skip
    assert first["status"]["admission"]["clusterQueue"].startswith("cq-")
    wait_for(
        lambda: not job_suspended(cluster, namespace, "first"), timeout=15, what="the first Job unsuspended"
    )

    cluster.apply(queued_job("second", queues), namespace=namespace)

    def pending_reason() -> str | None:
        wl = workload_of(cluster, namespace, "second")
        for c in (wl or {}).get("status", {}).get("conditions", []):
            if c["type"] == "QuotaReserved" and c["status"] == "False":
                return str(c["message"])
        return None

    message = wait_for(pending_reason, timeout=30, what="the second Workload's QuotaReserved=False")
    assert "insufficient" in message.lower() and "quota" in message.lower(), message
    assert job_suspended(cluster, namespace, "second")
    second = workload_of(cluster, namespace, "second")
    assert second is not None and condition(second, "Admitted") != "True"

    # The first Job's pod finishes (kwok plays the run); Kueue releases its quota to the second.
    pod = wait_for(
        lambda: cluster.kubectl("get", "pods", "-n", namespace, "-l", "job-name=first", "-o",
                                "jsonpath={.items[0].metadata.name}", check=False).stdout,
        timeout=30, what="the first Job's pod",
    )  # fmt: skip
    cluster.kubectl("annotate", "pod", pod, "-n", namespace, f"{SIM_RUN_FOR}=0s")
    wait_for(lambda: condition(cluster.get_json("job", "first", "-n", namespace), "Complete") == "True",
             timeout=30, what="the first Job Complete")  # fmt: skip
    wait_for(
        lambda: (wl := workload_of(cluster, namespace, "second")) and condition(wl, "Admitted") == "True",
        timeout=30, what="the second Job's Workload Admitted after the first finished",
    )  # fmt: skip
    wait_for(
        lambda: not job_suspended(cluster, namespace, "second"), timeout=15, what="the second Job unsuspended"
    )


def test_a_pod_group_is_gated_until_kueue_admits_all_of_it(
    cluster: Cluster, namespace: str, queues: str
) -> None:
    # Kueue's pod integration (plain pod groups, all or nothing): its webhook gates each pod, and the
    # group's one Workload is admitted only when the quota holds both pods (2 x 500m of 1 CPU).
    def group_pod(index: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"member-{index}",
                "labels": {QUEUE_NAME_LABEL: queues, "kueue.x-k8s.io/pod-group-name": "pair"},
                "annotations": {"kueue.x-k8s.io/pod-group-total-count": "2", SIM_TERMINATE_AFTER: "0s"},
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "500m"}}}],
            },
        }

    created = cluster.kubectl(
        "create", "-n", namespace, "-f", "-", "-o", "json", input=json.dumps(group_pod(0))
    )
    gates = [g["name"] for g in json.loads(created.stdout)["spec"].get("schedulingGates", [])]
    assert "kueue.x-k8s.io/admission" in gates, gates
    # One member alone is not the group: a while later it is still gated and unbound, nothing admitted.
    time.sleep(2)
    alone = cluster.get_json("pod", "member-0", "-n", namespace)
    assert alone["spec"].get("schedulingGates") and not alone["spec"].get("nodeName")
    admitted = cluster.get_json("workloads.kueue.x-k8s.io", "-n", namespace)["items"]
    assert not [w for w in admitted if condition(w, "Admitted") == "True"]
    cluster.apply(group_pod(1), namespace=namespace)

    def running_pods() -> list[str]:
        pods = cluster.get_json("pods", "-n", namespace)["items"]
        return sorted(p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running")

    assert wait_for(
        lambda: running_pods() == ["member-0", "member-1"], timeout=30, what="both members Running"
    )
    workloads = cluster.get_json("workloads.kueue.x-k8s.io", "-n", namespace)["items"]
    assert len(workloads) == 1 and condition(workloads[0], "Admitted") == "True"
    assert [ps["count"] for ps in workloads[0]["spec"]["podSets"]] == [2]
