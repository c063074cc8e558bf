"""TrainingJobs admitted by a real Kueue (issue 18 items 2-4): the operator owns one Workload per
job labelled kueue.x-k8s.io/queue-name and starts the gang only once Kueue admits it.

Each test gets private kwok nodes (tainted, labelled with a unique key) and a ResourceFlavor whose
nodeLabels and tolerations are that key: the job itself names no placement, so its pods reach those
nodes only through what the operator injects from the flavor Kueue assigned.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from phalanx.devcluster.kueue import QUEUE_NAME_LABEL, KueueState
from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.integration.test_kueue_dev import condition
from tests.jobs import job_pods, job_status, training_job, wait_phase

pytestmark = pytest.mark.integration

WORKLOADS = "workloads.kueue.x-k8s.io"
LQ = "lq"
FINALIZER = "kueue.x-k8s.io/resource-in-use"


class Queues:
    """One ClusterQueue (quota for one 2-GPU job unless told otherwise) behind LocalQueue `lq`."""

    def __init__(self, cluster: Cluster, namespace: str, placement: dict[str, Any]) -> None:
        self.cluster, self.namespace, self.placement = cluster, namespace, placement
        self.tag = uuid.uuid4().hex[:6]
        self.flavors: list[str] = []
        self.cq = f"cq-{self.tag}"

    def flavor(self, suffix: str) -> str:
        name = f"{suffix}-{self.tag}"
        self.cluster.apply({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": self.placement["nodeSelector"], "tolerations": self.placement["tolerations"]},
        })  # fmt: skip
        self.flavors.append(name)
        return name

    def cluster_queue(self, groups: list[dict[str, Any]], preemption: dict[str, Any] | None = None) -> None:
        spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": groups}
        if preemption:
            spec["preemption"] = preemption
        self.cluster.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                            "metadata": {"name": self.cq}, "spec": spec})  # fmt: skip
        self.cluster.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                            "metadata": {"name": LQ}, "spec": {"clusterQueue": self.cq}},
                           namespace=self.namespace)  # fmt: skip
        wait_for(lambda: condition(self.cluster.get_json("clusterqueue", self.cq), "Active") == "True",
                 timeout=30, what=f"ClusterQueue {self.cq} Active")  # fmt: skip

    def gpu_queue(self, gpus: int = 2, preemption: dict[str, Any] | None = None) -> str:
        flavor = self.flavor("gpu")
        self.cluster_queue(
            [{"coveredResources": ["nvidia.com/gpu"],
              "flavors": [{"name": flavor, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}]}],
            preemption,
        )  # fmt: skip
        return flavor

    def clean_up(self) -> None:
        # While Kueue runs: its finalizers on workloads and queues are removed only by Kueue.
        k = self.cluster.kubectl
        k("delete", "tj", "--all", "-n", self.namespace, "--timeout=60s", check=False)
        k("delete", WORKLOADS, "--all", "-n", self.namespace, "--timeout=30s", check=False)
        k("delete", "localqueue", LQ, "-n", self.namespace, "--timeout=30s", check=False)
        k("delete", "clusterqueue", self.cq, "--timeout=30s", check=False)
        for flavor in self.flavors:
            k("delete", "resourceflavor", flavor, "--timeout=30s", check=False)


@pytest.fixture
def queues(
    cluster: Cluster, namespace: str, kueue: KueueState, private_nodes: Any, operator: OperatorProcess
) -> Iterator[Queues]:
    private_nodes.add(2, gpus=8, mig={"1g.10gb": 7})
    q = Queues(cluster, namespace, private_nodes.placement())
    try:
        yield q
    finally:
        q.clean_up()


def queued(name: str, **kwargs: Any) -> dict[str, Any]:
    """A 2-pod, 1-GPU-per-pod TrainingJob in LocalQueue `lq`; pods stop 1 s after SIGTERM."""
    job = training_job(name, replicas=2, terminate_after="1s", **kwargs)
    job["metadata"]["labels"] = {QUEUE_NAME_LABEL: LQ}
    return job


def workload_of(cluster: Cluster, namespace: str, job: str) -> dict[str, Any] | None:
    for wl in cluster.get_json(WORKLOADS, "-n", namespace)["items"]:
        for ref in wl["metadata"].get("ownerReferences", []):
            if ref["kind"] == "TrainingJob" and ref["name"] == job and ref.get("controller"):
                return dict(wl)
    return None


def admitted(cluster: Cluster, namespace: str, job: str) -> bool:
    wl = workload_of(cluster, namespace, job)
    return wl is not None and condition(wl, "Admitted") == "True"


def wait_running(cluster: Cluster, namespace: str, job: str, timeout: float = 60) -> dict[str, Any]:
    return wait_phase(cluster, namespace, job, "Running", timeout=timeout)


def waiting_message(cluster: Cluster, namespace: str, job: str, fragment: str) -> str:
    """The job's status message once it says it waits for Kueue and holds `fragment` (Kueue says
    first that it has not looked at the Workload yet, then why it cannot admit it)."""
    status: dict[str, Any] = wait_for(
        lambda: (s := job_status(cluster, namespace, job)).get("phase") == "Pending"
        and "kueue" in (m := (s.get("message") or "").lower()) and fragment.lower() in m and s,
        timeout=30, what=f"{job} waiting for Kueue ({fragment})",
    )  # fmt: skip
    return str(status["message"])


def finish(cluster: Cluster, namespace: str, job: str, exit_code: int = 0) -> None:
    """kwok plays the run to its end: every pod exits with `exit_code` now."""
    for pod in job_pods(cluster, namespace, job):
        cluster.kubectl("annotate", "pod", pod["metadata"]["name"], "-n", namespace, "--overwrite",
                        "phalanx.dev/sim-run-for=0s", f"phalanx.dev/sim-exit-code={exit_code}")  # fmt: skip


def test_quota_for_one_job_runs_one_and_the_other_waits_with_kueues_reason(
    cluster: Cluster, namespace: str, queues: Queues
) -> None:
    queues.gpu_queue()
    cluster.apply(queued("first"), namespace)
    status = wait_running(cluster, namespace, "first")
    wl = workload_of(cluster, namespace, "first")
    assert wl is not None and wl["spec"]["queueName"] == LQ
    (podset,) = wl["spec"]["podSets"]
    assert podset["name"] == "workers" and podset["count"] == 2
    assert status["admission"]["by"] == "Kueue" and status["admission"]["clusterQueue"] == queues.cq
    # What Kueue's waitForPodsReady reads: the owner says when the whole gang runs.
    wait_for(lambda: condition(workload_of(cluster, namespace, "first") or {}, "PodsReady") == "True",
             timeout=15, what="the first Workload PodsReady")  # fmt: skip
    # The flavor's node labels and tolerations were injected: the private nodes are the only fit.
    for pod in job_pods(cluster, namespace, "first"):
        assert pod["spec"]["nodeSelector"] == queues.placement["nodeSelector"]
        assert queues.placement["tolerations"][0] in pod["spec"]["tolerations"]
        assert pod["spec"]["nodeName"].startswith("p-")

    cluster.apply(queued("second"), namespace)
    message = waiting_message(cluster, namespace, "second", "insufficient")
    assert "quota" in message.lower(), message
    assert job_pods(cluster, namespace, "second") == []  # no pod exists before Kueue admits it

    finish(cluster, namespace, "first")
    wait_phase(cluster, namespace, "first", "Succeeded")
    wait_for(lambda: condition(workload_of(cluster, namespace, "first") or {}, "Finished") == "True",
             timeout=30, what="the first Workload Finished")  # fmt: skip
    wait_running(cluster, namespace, "second")
    assert job_status(cluster, namespace, "second")["admission"]["waitedSeconds"] >= 0


@pytest.mark.parametrize("how", ["failure", "deletion"])
def test_quota_is_released_on_failure_and_on_deletion(
    cluster: Cluster, namespace: str, queues: Queues, how: str
) -> None:
    queues.gpu_queue()
    cluster.apply(queued("first", runPolicy={"backoffLimit": 0}), namespace)
    wait_running(cluster, namespace, "first")
    cluster.apply(queued("second"), namespace)
    waiting_message(cluster, namespace, "second", "insufficient")
    if how == "failure":
        finish(cluster, namespace, "first", exit_code=1)
        wait_phase(cluster, namespace, "first", "Failed")
    else:
        cluster.kubectl("delete", "tj", "first", "-n", namespace, "--wait=false")
    wait_running(cluster, namespace, "second")
    if how == "deletion":  # garbage-collected by its ownerReference
        wait_for(lambda: workload_of(cluster, namespace, "first") is None, timeout=60,
                 what="the deleted job's Workload gone")  # fmt: skip


def test_a_deleted_jobs_quota_is_held_until_its_pods_have_stopped(
    cluster: Cluster, namespace: str, queues: Queues
) -> None:
    # Garbage collection deletes the Workload at once; the pods take their grace period (here 20 s
    # after SIGTERM): Kueue's finalizer keeps the quota booked until they are gone, or the next job
    # would be admitted onto devices still in use.
    queues.gpu_queue()
    first = training_job("first", replicas=2, terminate_after="20s")
    first["metadata"]["labels"] = {QUEUE_NAME_LABEL: LQ}
    cluster.apply(first, namespace)
    wait_running(cluster, namespace, "first")
    cluster.apply(queued("second"), namespace)
    waiting_message(cluster, namespace, "second", "insufficient")

    cluster.kubectl("delete", "tj", "first", "-n", namespace, "--wait=false")
    deleted = time.monotonic()
    wait_for(lambda: (pods := job_pods(cluster, namespace, "first"))
             and all(p["metadata"].get("deletionTimestamp") for p in pods),
             timeout=30, what="the deleted job's pods terminating")  # fmt: skip
    while job_pods(cluster, namespace, "first"):
        assert job_pods(cluster, namespace, "second") == [], "second started while first's pods still stop"
        # Read before the pods: a pod not yet terminal now was not then either, so the Workload
        # must have been there, holding the finalizer (a terminal pod may outlive the release).
        wl = workload_of(cluster, namespace, "first")
        stopping = [p for p in job_pods(cluster, namespace, "first")
                    if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]  # fmt: skip
        if stopping:
            assert wl is not None, "the deleted job's Workload is gone while its pods still stop"
            assert FINALIZER in wl["metadata"].get("finalizers", []), (
                "the deleted job's Workload lost Kueue's finalizer while its pods still stop"
            )
        time.sleep(0.5)
    assert time.monotonic() - deleted > 10, "the deleted job's pods stopped too soon to show anything"
    wait_running(cluster, namespace, "second")
    wait_for(lambda: workload_of(cluster, namespace, "first") is None, timeout=30,
             what="the deleted job's Workload gone once its pods are")  # fmt: skip


def test_a_deleted_workload_requeues_its_running_job_which_runs_again_on_a_fresh_one(
    cluster: Cluster, namespace: str, queues: Queues
) -> None:
    # `kubectl delete workload` is Kueue's usual way to requeue: the gang stops (its pods, not the
    # Workload, go first), the finalizer comes off, and a fresh Workload is admitted.
    queues.gpu_queue()
    cluster.apply(queued("first"), namespace)
    wait_running(cluster, namespace, "first")
    old = workload_of(cluster, namespace, "first")
    assert old is not None
    first_pods = {p["metadata"]["uid"] for p in job_pods(cluster, namespace, "first")}
    cluster.kubectl("delete", WORKLOADS, old["metadata"]["name"], "-n", namespace, "--wait=false")
    wait_for(lambda: job_status(cluster, namespace, "first")["restarts"].get("requeues") == 1,
             timeout=30, what="the job requeued (WorkloadDeleted)")  # fmt: skip
    wait_running(cluster, namespace, "first", timeout=90)
    fresh = workload_of(cluster, namespace, "first")
    assert fresh is not None and fresh["metadata"]["uid"] != old["metadata"]["uid"]
    assert condition(fresh, "Admitted") == "True"
    assert not {p["metadata"]["uid"] for p in job_pods(cluster, namespace, "first")} & first_pods


def test_suspending_a_job_hands_its_quota_to_the_next_and_resuming_queues_it_again(
    cluster: Cluster, namespace: str, queues: Queues
) -> None:
    queues.gpu_queue()
    cluster.apply(queued("first"), namespace)
    wait_running(cluster, namespace, "first")
    cluster.apply(queued("second"), namespace)
    waiting_message(cluster, namespace, "second", "insufficient")
    suspend = '{"spec": {"runPolicy": {"suspend": %s}}}'
    cluster.kubectl("patch", "tj", "first", "-n", namespace, "--type=merge", "-p", suspend % "true")
    wait_phase(cluster, namespace, "first", "Suspended")
    wait_running(cluster, namespace, "second")  # the suspended job's Workload is inactive: quota free
    cluster.kubectl("patch", "tj", "first", "-n", namespace, "--type=merge", "-p", suspend % "false")
    waiting_message(cluster, namespace, "first", "insufficient")
    assert job_status(cluster, namespace, "first")["restarts"]["preemptions"] == 0


def test_a_higher_priority_job_preempts_a_running_one_which_waits_and_comes_back(
    cluster: Cluster, namespace: str, queues: Queues
) -> None:
    tag = queues.tag
    for name, value in ((f"low-{tag}", 100), (f"high-{tag}", 1000)):
        cluster.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                       "metadata": {"name": name}, "value": value})  # fmt: skip
    try:
        queues.gpu_queue(preemption={"withinClusterQueue": "LowerPriority"})
        cluster.apply(queued("victim", scheduling={"priorityClassName": f"low-{tag}"}), namespace)
        wait_running(cluster, namespace, "victim")
        first_pods = {p["metadata"]["uid"] for p in job_pods(cluster, namespace, "victim")}
        cluster.apply(queued("urgent", scheduling={"priorityClassName": f"high-{tag}"}), namespace)

        message = waiting_message(cluster, namespace, "victim", "evicted")
        assert "preempt" in message.lower(), message
        status = job_status(cluster, namespace, "victim")
        assert status["restarts"]["preemptions"] == 1 and status["restarts"]["failures"] == 0
        wait_running(cluster, namespace, "urgent")
        assert not {p["metadata"]["uid"] for p in job_pods(cluster, namespace, "victim")} & first_pods

        finish(cluster, namespace, "urgent")
        status = wait_running(cluster, namespace, "victim")
        assert status["restarts"]["preemptions"] == 1 and status["restarts"]["failures"] == 0
        assert status["attempt"] == 1
    finally:
        cluster.kubectl("delete", "priorityclass", f"low-{tag}", f"high-{tag}", check=False)


def test_a_mig_job_is_admitted_only_against_a_flavor_with_its_profile(
    cluster: Cluster, namespace: str, queues: Queues
) -> None:
    mig = "nvidia.com/mig-1g.10gb"
    flavor = queues.flavor("mig")
    queues.cluster_queue([{"coveredResources": [mig],
                           "flavors": [{"name": flavor, "resources": [{"name": mig, "nominalQuota": "4"}]}]}])  # fmt: skip
    cluster.apply(
        queued("slices", gpus=None, resources={"mig": {"profile": "1g.10gb", "count": 1}}), namespace
    )
    wait_running(cluster, namespace, "slices")
    wl = workload_of(cluster, namespace, "slices")
    assert wl is not None
    (assignment,) = wl["status"]["admission"]["podSetAssignments"]
    assert assignment["flavors"] == {mig: flavor}

    cluster.apply(
        queued("other", gpus=None, resources={"mig": {"profile": "3g.40gb", "count": 1}}), namespace
    )
    waiting_message(cluster, namespace, "other", "mig-3g.40gb")


def test_a_job_managed_by_another_controller_is_left_alone(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # MultiKueue's contract: the manager cluster's copy names the MultiKueue controller; a worker
    # cluster's copy (no managedBy) is this operator's. Neither gets a Workload from here.
    cluster.apply(training_job("elsewhere", managedBy="kueue.x-k8s.io/multikueue"), namespace)
    cluster.apply(training_job("here", managedBy="phalanx.dev/operator"), namespace)
    wait_running(cluster, namespace, "here")
    assert (
        job_status(cluster, namespace, "elsewhere") == {} and job_pods(cluster, namespace, "elsewhere") == []
    )
    changed = cluster.kubectl("patch", "tj", "elsewhere", "-n", namespace, "--type=merge",
                              "-p", '{"spec": {"managedBy": "phalanx.dev/operator"}}', check=False)  # fmt: skip
    assert changed.returncode != 0 and "spec.managedBy is immutable" in changed.stderr, changed.stderr


def test_with_a_local_queue_named_default_kueue_leaves_the_worker_pods_to_the_operator(
    cluster: Cluster, namespace: str, queues: Queues
) -> None:
    # Kueue's LocalQueueDefaulting puts pods of a namespace with a LocalQueue `default` in it, and its
    # pod integration would then gate each worker pod of a queued job as a workload of its own,
    # unless TrainingJob is one of its integrations.externalFrameworks (docs/kueue.md): then Kueue
    # finds the pods' queued owner and leaves them to it.
    queues.gpu_queue()
    cluster.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                   "metadata": {"name": "default"}, "spec": {"clusterQueue": queues.cq}},
                  namespace=namespace)  # fmt: skip
    try:
        cluster.apply(queued("queued"), namespace)
        pods = wait_for(lambda: len(p := job_pods(cluster, namespace, "queued")) == 2 and p,
                        timeout=60, what="the queued job's pods")  # fmt: skip
        for pod in pods:
            gates = [g["name"] for g in pod["spec"].get("schedulingGates") or []]
            assert "kueue.x-k8s.io/admission" not in gates, pod["spec"]
            assert QUEUE_NAME_LABEL not in (pod["metadata"].get("labels") or {}), pod["metadata"]
            assert "kueue.x-k8s.io/managed" not in (pod["metadata"].get("finalizers") or []), pod["metadata"]
        wait_running(cluster, namespace, "queued")
        # No Workload of Kueue's pod integration: only the job's own.
        owners = [ref["kind"] for wl in cluster.get_json(WORKLOADS, "-n", namespace)["items"]
                  for ref in wl["metadata"].get("ownerReferences", [])]  # fmt: skip
        assert owners == ["TrainingJob"], owners
    finally:
        cluster.kubectl("delete", "localqueue", "default", "-n", namespace, "--timeout=30s", check=False)


def test_a_job_resized_while_suspended_is_queued_again_at_its_new_size(
    cluster: Cluster, namespace: str, queues: Queues
) -> None:
    # Its Workload was built for 2 pods: admitted as it was, 4 pods would run against quota for 2.
    queues.gpu_queue(gpus=2)
    cluster.apply(queued("resized", runPolicy={"suspend": True}), namespace)
    wait_for(lambda: (wl := workload_of(cluster, namespace, "resized")) is not None
             and wl["spec"]["podSets"][0]["count"] == 2, timeout=30, what="the 2-pod Workload")  # fmt: skip
    cluster.kubectl("patch", "tj", "resized", "-n", namespace, "--type=merge",
                    "-p", '{"spec": {"replicas": 4, "runPolicy": {"suspend": false}}}')  # fmt: skip
    message = waiting_message(cluster, namespace, "resized", "insufficient")
    assert "quota" in message.lower(), message
    wl = workload_of(cluster, namespace, "resized")
    assert wl is not None and wl["spec"]["podSets"][0]["count"] == 4 and wl["spec"]["active"] is True
    assert job_pods(cluster, namespace, "resized") == []
