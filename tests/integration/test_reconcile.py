"""The core reconcile against the real control plane: pods, Service, env, status, restarts."""

from __future__ import annotations

import time

import pytest

from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.jobs import job_pods, job_status, training_job, wait_phase

pytestmark = pytest.mark.integration


def test_four_replicas_of_two_gpus_get_pods_service_env_resources_and_volumes(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    job = training_job(
        "llm",
        replicas=4,
        gpus=2,
        checkpoint={"volume": {"hostPath": {"path": "/tmp/ckpt"}}, "intervalSteps": 50},
        nccl={"debug": "WARN", "ibDisable": True},
    )
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "NCCL_ASYNC_ERROR_HANDLING", "value": "0"}
    ]
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "llm", "Running")
    uid = cluster.get_json("tj", "llm", "-n", namespace)["metadata"]["uid"]
    pods = sorted(job_pods(cluster, namespace, "llm"), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == [f"llm-worker-{i}" for i in range(4)]

    service = cluster.get_json("service", "llm", "-n", namespace)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"phalanx.dev/job-name": "llm"}

    master = f"llm-worker-0.llm.{namespace}.svc.cluster.local"
    for rank, pod in enumerate(pods):
        spec = pod["spec"]
        assert spec["hostname"] == f"llm-worker-{rank}" and spec["subdomain"] == "llm"
        assert spec["restartPolicy"] == "Never"
        assert spec["automountServiceAccountToken"] is False
        assert spec["terminationGracePeriodSeconds"] == 60
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
        labels = pod["metadata"]["labels"]
        assert labels["phalanx.dev/replica-index"] == str(rank) and labels["phalanx.dev/attempt"] == "0"
        assert labels["app.kubernetes.io/managed-by"] == "phalanx"
        (trainer,) = spec["containers"]
        assert trainer["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        assert trainer["resources"]["requests"] == {"nvidia.com/gpu": "2"}
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        expected = {
            "MASTER_ADDR": master, "MASTER_PORT": "29500", "WORLD_SIZE": "8", "NNODES": "4",
            "NODE_RANK": str(rank), "NPROC_PER_NODE": "2", "PET_NNODES": "4", "PET_NPROC_PER_NODE": "2",
            "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": master, "PET_MASTER_PORT": "29500",
            "PHALANX_JOB_NAME": "llm", "PHALANX_JOB_UID": uid, "PHALANX_ATTEMPT": "0",
            "PHALANX_CHECKPOINT_DIR": "/checkpoints", "PHALANX_CHECKPOINT_INTERVAL_STEPS": "50",
            "PHALANX_CHECKPOINT_KEEP": "3", "NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": "1",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": "0",
        }  # fmt: skip
        assert {k: env.get(k) for k in expected} == expected
        assert [e["name"] for e in trainer["env"]].count("NCCL_ASYNC_ERROR_HANDLING") == 1
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["phalanx-dshm"]["emptyDir"] == {"medium": "Memory"}
        assert volumes["phalanx-checkpoints"]["hostPath"]["path"] == "/tmp/ckpt"
        mounts = {m["mountPath"] for m in trainer["volumeMounts"]}
        assert {"/dev/shm", "/checkpoints"} <= mounts
    status = job_status(cluster, namespace, "llm")
    assert status["readySummary"] == "4/4" and status["attempt"] == 0
    assert any(c["type"] == "Running" and c["status"] == "True" for c in status["conditions"])


def test_mig_job_requests_the_mig_resource_and_lands_on_a_mig_node(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    job = training_job("mig", replicas=2, gpus=None, resources={"mig": {"profile": "1g.10gb", "count": 1}})
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "mig", "Running")
    for pod in job_pods(cluster, namespace, "mig"):
        (trainer,) = pod["spec"]["containers"]
        assert trainer["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
        assert pod["spec"]["nodeName"] == "mig-node-0"
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        assert env["WORLD_SIZE"] == "2"  # procsPerReplica defaults to 1 without whole GPUs


def test_pods_that_succeed_make_the_job_succeed_with_completion_time(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(training_job("done", replicas=2, run_for="2s"), namespace)
    status = wait_phase(cluster, namespace, "done", "Succeeded")
    assert status["completionTime"] >= status["startTime"]
    assert status["replicas"]["succeeded"] == 2
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=done")[
        "items"
    ]
    assert {"AllWorkersRunning", "Completed"} <= {e["reason"] for e in events}


def test_permanent_exit_code_fails_the_job_with_the_reason(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(training_job("bad", replicas=2, run_for="1s", exit_code=2), namespace)
    status = wait_phase(cluster, namespace, "bad", "Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert "exited with code 2" in failed["message"], failed
    assert status["restarts"]["failures"] == 0 and status["attempt"] == 0


def test_retryable_failures_restart_the_gang_until_the_backoff_limit(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(training_job("flaky", replicas=2, run_for="1s", exit_code=137, runPolicy={"backoffLimit": 2}),
                  namespace)  # fmt: skip
    status = wait_phase(cluster, namespace, "flaky", "Failed", timeout=90)
    assert status["restarts"] == {"failures": 2, "preemptions": 0, "hangs": 0}
    assert status["attempt"] == 2
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    wait_for(lambda: all(p["status"].get("phase") in ("Failed", "Succeeded") for p in job_pods(cluster, namespace, "flaky")),
             timeout=30, what="nothing left running")  # fmt: skip


def test_operator_killed_between_pod_creations_leaves_exactly_replicas_pods(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    operator.stop()
    operator.start(extra_env={"PHALANX_FAILPOINT_EXIT_AFTER_PODS": "2"})
    cluster.apply(training_job("crash", replicas=5), namespace)
    assert operator.proc is not None
    operator.proc.wait(timeout=60)  # the failpoint killed it after its second pod
    assert operator.proc.returncode == 3
    assert len(job_pods(cluster, namespace, "crash")) == 2
    operator.start()
    wait_phase(cluster, namespace, "crash", "Running")
    names = sorted(p["metadata"]["name"] for p in job_pods(cluster, namespace, "crash"))
    assert names == [f"crash-worker-{i}" for i in range(5)]


def test_suspend_deletes_pods_keeps_status_and_resume_starts_a_new_attempt(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # Deleted pods take their grace period (60 s) to stop; these trainers stop 2 s after SIGTERM.
    cluster.apply(training_job("pause", replicas=2, terminate_after="2s"), namespace)
    wait_phase(cluster, namespace, "pause", "Running")
    cluster.kubectl(
        "patch",
        "tj",
        "pause",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"suspend":true}}}',
    )
    wait_phase(cluster, namespace, "pause", "Suspended")
    wait_for(lambda: not job_pods(cluster, namespace, "pause"), timeout=30, what="pods deleted")
    cluster.kubectl(
        "patch",
        "tj",
        "pause",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"suspend":false}}}',
    )
    status = wait_phase(cluster, namespace, "pause", "Running")
    assert status["attempt"] == 1 and status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}


def test_ttl_after_finished_deletes_the_job_and_its_pods(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(
        training_job("short", replicas=1, run_for="1s", runPolicy={"ttlSecondsAfterFinished": 2}), namespace
    )
    wait_for(lambda: cluster.kubectl("get", "tj", "short", "-n", namespace, check=False).returncode != 0,
             timeout=60, what="job deleted by TTL")  # fmt: skip
    wait_for(lambda: not job_pods(cluster, namespace, "short"), timeout=60, what="pods garbage-collected")


def test_kubectl_get_shows_columns_and_explain_shows_descriptions(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(training_job("cols", replicas=2), namespace)
    wait_phase(cluster, namespace, "cols", "Running")
    header, row = cluster.kubectl("get", "tj", "-n", namespace).stdout.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "PHASE",
        "READY",
        "REPLICAS",
        "RESTARTS",
        "PREEMPTED",
        "PROGRESS",
        "AGE",
    ]
    assert row.split()[:6] == ["cols", "Running", "2/2", "2", "0", "0"]
    explain = cluster.kubectl("explain", "trainingjob.spec.replicas").stdout
    assert "WORLD_SIZE = replicas x procsPerReplica" in explain
    assert "tj" in cluster.kubectl("api-resources", "--api-group=phalanx.dev").stdout


def test_admitted_pods_the_scheduler_cannot_place_say_why_in_status(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    job = training_job(
        "nopvc", replicas=2, checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "absent"}}}
    )
    cluster.apply(job, namespace)
    status = wait_for(
        lambda: "absent" in (s := job_status(cluster, namespace, "nopvc")).get("message", "") and s,
        timeout=60,
        what="status message naming the scheduler's reason",
    )
    assert status["phase"] == "Admitted"


def test_a_job_suspended_longer_than_its_deadline_runs_again_when_resumed(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    deadline = 12
    job = training_job("nap", replicas=2, terminate_after="1s", runPolicy={"activeDeadlineSeconds": deadline})
    cluster.apply(job, namespace)  # pods that stop within 1 s of their deletion, as trainers that exit
    wait_phase(cluster, namespace, "nap", "Running")
    cluster.kubectl(
        "patch", "tj", "nap", "-n", namespace, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}'
    )
    wait_phase(cluster, namespace, "nap", "Suspended")
    time.sleep(deadline + 2)  # suspended past the deadline: the clock is stopped meanwhile
    cluster.kubectl(
        "patch",
        "tj",
        "nap",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"suspend":false}}}',
    )
    status = wait_phase(cluster, namespace, "nap", "Running", timeout=30)
    assert status["attempt"] == 1
    resumed_at = time.monotonic()
    # Then the deadline counts from the new start and ends the job, as batch/v1 Job does.
    status = wait_phase(cluster, namespace, "nap", "Failed", timeout=deadline + 30)
    assert time.monotonic() - resumed_at >= deadline - 4, "failed long before its deadline since resuming"
    assert any(c["reason"] == "DeadlineExceeded" for c in status["conditions"])


def test_gang_timeout_does_not_tear_down_pods_an_external_scheduler_holds_in_its_queue(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # provider none: the default scheduler places the pods whenever it can; Phalanx admitted nothing.
    unplaceable = {"nodeSelector": {"phalanx.dev/no-such-node": "true"}}
    job = training_job("queue", replicas=2, placement=unplaceable,
                       scheduling={"provider": "none", "gang": {"timeoutSeconds": 10}})  # fmt: skip
    cluster.apply(job, namespace)
    pods = wait_for(
        lambda: len(p := job_pods(cluster, namespace, "queue")) == 2 and p, timeout=30, what="pods"
    )
    uids = sorted(p["metadata"]["uid"] for p in pods)
    time.sleep(20)  # twice the gang timeout
    status = job_status(cluster, namespace, "queue")
    assert sorted(p["metadata"]["uid"] for p in job_pods(cluster, namespace, "queue")) == uids
    assert status["attempt"] == 0 and not status.get("gangTimeouts"), status
