"""Checkpoint-aware preemption by a real Kueue, with real training on the dev node (issue 18 item 3).

The demo job (2 pods x 2 processes, 500m CPU and 1Gi each) runs at low priority in a ClusterQueue
with room for exactly it. A higher-priority kwok job in the same queue makes Kueue evict its
Workload: the operator stops the gang with its grace period, the trainer checkpoints on SIGTERM,
the quota goes back, the preemptor runs and finishes, and the victim is admitted again and resumes
from that checkpoint: 0 steps lost, counted as a preemption.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx import constants as c
from phalanx.devcluster.kueue import KueueState
from tests.conftest import Cluster, OperatorProcess, RealNode, create_namespace, wait_for
from tests.e2e.runs import (
    job_manifests,
    job_status,
    rank0_attempts,
    restart_counts,
    wait_for_step,
    wait_job_phase,
)
from tests.jobs import training_job

pytestmark = pytest.mark.e2e

STEPS = 160
INTERVAL = 20
RUN_TIMEOUT = 300.0


def condition(obj: dict[str, Any], kind: str) -> str | None:
    return next(
        (str(x["status"]) for x in (obj.get("status") or {}).get("conditions") or [] if x["type"] == kind),
        None,
    )


@pytest.fixture
def kueue_namespace(cluster: Cluster, kueue: KueueState) -> Iterator[tuple[str, str]]:
    """A namespace with LocalQueue `lq` on a ClusterQueue that holds the demo job exactly, preempting
    lower priorities; and PriorityClasses low-<tag> and high-<tag>. Yields (namespace, tag)."""
    tag = uuid.uuid4().hex[:6]
    ns = create_namespace(cluster, f"e2e-kueue-{tag}")
    flavor, cq = f"any-{tag}", f"cq-{tag}"
    for name, value in ((f"low-{tag}", 100), (f"high-{tag}", 1000)):
        cluster.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                       "metadata": {"name": name}, "value": value})  # fmt: skip
    cluster.apply([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                      {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "1"},
                                                     {"name": "memory", "nominalQuota": "2Gi"}]}]}]}},
    ])  # fmt: skip
    cluster.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq"},
                   "spec": {"clusterQueue": cq}}, namespace=ns)  # fmt: skip
    wait_for(lambda: condition(cluster.get_json("clusterqueue", cq), "Active") == "True", timeout=30,
             what=f"ClusterQueue {cq} Active")  # fmt: skip
    try:
        yield ns, tag
    finally:
        k = cluster.kubectl
        k("delete", "tj", "--all", "-n", ns, "--timeout=90s", check=False)
        k("delete", "workloads.kueue.x-k8s.io", "--all", "-n", ns, "--timeout=30s", check=False)
        k("delete", "localqueue", "lq", "-n", ns, "--timeout=30s", check=False)
        k("delete", "clusterqueue", cq, "--timeout=30s", check=False)
        k("delete", "resourceflavor", flavor, "--timeout=30s", check=False)
        k("delete", "priorityclass", f"low-{tag}", f"high-{tag}", check=False)
        k("delete", "namespace", ns, "--wait=false", check=False)


def test_kueue_preempts_a_training_job_which_checkpoints_waits_and_resumes_losing_no_step(
    cluster: Cluster, kueue_namespace: tuple[str, str], real_node: RealNode, operator: OperatorProcess,
    tmp_path: Path,
) -> None:  # fmt: skip
    ns, tag = kueue_namespace
    config_map, victim = job_manifests("victim", real_node, tmp_path, steps=STEPS, interval=INTERVAL)
    victim["metadata"]["labels"] = {c.KUEUE_QUEUE_LABEL: "lq"}
    victim["spec"]["scheduling"] = {"priorityClassName": f"low-{tag}"}
    cluster.apply([config_map, victim], ns)
    wait_for_step(real_node, ns, "victim", 0, STEPS // 3, timeout=RUN_TIMEOUT)
    assert job_status(cluster, ns, "victim")["admission"]["by"] == "Kueue"

    # kwok plays the preemptor: it asks the whole quota and runs 10 s once admitted.
    urgent = training_job("urgent", replicas=1, gpus=None, run_for="10s", terminate_after="1s",
                          scheduling={"priorityClassName": f"high-{tag}"})  # fmt: skip
    urgent["metadata"]["labels"] = {c.KUEUE_QUEUE_LABEL: "lq"}
    urgent["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "1", "memory": "2Gi"}
    }
    cluster.apply(urgent, ns)

    assert wait_job_phase(cluster, ns, "urgent", ("Succeeded", "Failed"), RUN_TIMEOUT) == "Succeeded"
    assert wait_job_phase(cluster, ns, "victim", ("Succeeded", "Failed"), RUN_TIMEOUT) == "Succeeded"
    status = job_status(cluster, ns, "victim")
    assert restart_counts(status) == {"failures": 0, "preemptions": 1, "hangs": 0}
    first, second = rank0_attempts(real_node, ns, "victim")
    assert first.preempted_at is not None, "rank 0 did not checkpoint on SIGTERM"
    assert second.resumed_from is not None and second.finished
    assert first.last_step - second.resumed_from == 0  # the SIGTERM checkpoint: nothing redone
    assert second.last_step == STEPS
