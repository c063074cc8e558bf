"""Reliability of the operator against the real control plane: restarts, deletion while down,
API server errors (429/503 through tests/faults.py), name conflicts, and status written by others.

docs/reliability.md says what each test shows and how to run them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.faults import Exchange, FaultProxy, Storm, proxy_kubeconfig, upstream_from_kubeconfig
from tests.integration.test_reconcile import job_pods, job_status, wait_phase
from tests.jobs import training_job

pytestmark = pytest.mark.integration

# No GPUs: these tests are about the control loop, and CPU-only pods never wait for capacity that a
# previous test's gang still holds.
NO_GPUS = None


def pod_uids(cluster: Cluster, ns: str, job: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(cluster, ns, job)}


def events_of(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json(
        "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def current_log(operator: OperatorProcess) -> str:
    """The log of the operator process started last (OperatorProcess numbers its log files)."""
    return (operator.log_dir / f"operator-{operator.starts}.log").read_text(errors="replace")


def prove_operator_reconciles(cluster: Cluster, ns: str, probe: str) -> None:
    """A fresh job given a status shows the (re)started operator has listed and reconciled: jobs
    that existed before it started were in its initial listing, ahead of this one."""
    cluster.apply(training_job(probe, replicas=1, gpus=NO_GPUS), ns)
    wait_for(lambda: job_status(cluster, ns, probe).get("phase"), timeout=45, what=f"{probe} reconciled")


def exists(cluster: Cluster, *args: str) -> bool:
    return cluster.kubectl("get", *args, check=False).returncode == 0


# -- 1. deleted while the operator is down ------------------------------------------------------------


def test_job_deleted_while_operator_is_down_is_garbage_collected_and_not_recreated(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    job = training_job("gone", replicas=2, gpus=NO_GPUS, runPolicy={"terminationGracePeriodSeconds": 1})
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "gone", "Running")
    assert len(pod_uids(cluster, namespace, "gone")) == 2 and exists(
        cluster, "service", "gone", "-n", namespace
    )

    operator.stop()
    cluster.kubectl("delete", "tj", "gone", "-n", namespace, "--wait=false")
    # No finalizers: the job goes at once and the garbage collector removes what it owned.
    wait_for(lambda: not job_pods(cluster, namespace, "gone"), timeout=45, what="pods garbage-collected")
    wait_for(lambda: not exists(cluster, "service", "gone", "-n", namespace), timeout=30, what="service gone")
    assert not exists(cluster, "tj", "gone", "-n", namespace)

    operator.start()
    prove_operator_reconciles(cluster, namespace, "after-restart")
    time.sleep(2)  # room for a wrong recreation to show up
    assert not job_pods(cluster, namespace, "gone")
    assert not exists(cluster, "service", "gone", "-n", namespace)
    assert not exists(cluster, "tj", "gone", "-n", namespace)
    log = current_log(operator)
    assert "Traceback" not in log, log


# -- 2. restarts while a job runs -------------------------------------------------------------------------


def test_operator_restarted_three_times_while_a_job_runs_changes_nothing(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(training_job("steady", replicas=3, gpus=NO_GPUS), namespace)
    before = wait_phase(cluster, namespace, "steady", "Running")
    uids = pod_uids(cluster, namespace, "steady")
    assert sorted(uids) == [f"steady-worker-{i}" for i in range(3)]

    for round_, halt in enumerate((operator.kill, operator.stop, operator.kill)):
        halt()  # kill: SIGKILL, no cleanup; stop: SIGTERM, kopf's orderly shutdown
        operator.start()
        prove_operator_reconciles(cluster, namespace, f"probe-{round_}")
        assert pod_uids(cluster, namespace, "steady") == uids, f"pods replaced after restart {round_ + 1}"

    time.sleep(2)
    after = job_status(cluster, namespace, "steady")
    assert pod_uids(cluster, namespace, "steady") == uids
    assert after["phase"] == "Running" and after["attempt"] == 0
    assert after["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}
    # A restart that re-derives the same state writes nothing: the status is what it was.
    assert after == before
    assert not [e for e in events_of(cluster, namespace, "steady") if e["type"] == "Warning"]


# -- 3. API server answering 429 and 503 ------------------------------------------------------------------


@pytest.fixture
def proxied_operator(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> Iterator[tuple[FaultProxy, OperatorProcess]]:
    """The shared operator, restarted to talk to the API server only through a FaultProxy."""
    proxy = FaultProxy(upstream_from_kubeconfig(cluster.kubeconfig, tmp_path)).start()
    kubeconfig = proxy_kubeconfig(proxy, tmp_path / "proxy-kubeconfig")
    operator.stop()
    # Failed reconciles retried at least every 4 s (PHALANX_RETRY_MAX_SECONDS): the storm below fails
    # every other request of each endpoint, so a reconcile needing several succeeds on few tries;
    # with the default 60 s cap the 300 s wait held 9 tries and the test failed in CI (2 runs of 4).
    operator.start(extra_env={"KUBECONFIG": str(kubeconfig), "PHALANX_RETRY_MAX_SECONDS": "4"})
    try:
        wait_for(
            lambda: any(
                e.is_watch and "/trainingjobs" in e.path and e.status == 200 for e in proxy.exchanges()
            ),
            timeout=30,
            what="the operator watching TrainingJobs through the proxy",
        )
        yield proxy, operator
    finally:
        operator.stop()
        operator.start()  # the normal operator for the tests after this one, even on failure
        proxy.close()


def test_job_submitted_while_the_api_server_answers_429_and_503_converges_without_duplicates(
    cluster: Cluster, namespace: str, proxied_operator: tuple[FaultProxy, OperatorProcess]
) -> None:
    proxy, operator = proxied_operator
    pods_path = f"/api/v1/namespaces/{namespace}/pods"

    def pod_creations() -> list[Exchange]:
        return [e for e in proxy.exchanges() if e.method == "POST" and e.path.startswith(pods_path)]

    # Reads are refused before the API server sees them; writes are applied and their answer lost,
    # the harder case for idempotence: the operator must not create a pod it was told failed twice.
    # The storm is counted in faults, not seconds: a seeded draw picks which requests fail, never more
    # than two in a row on one endpoint (so each retry is closer to success and no reconcile is
    # locked out), and the first pod creation always loses its answer.
    storm = Storm(statuses=(429, 503), probability=0.5, seed=20261201, faults=24,
                  first_refused=(("POST", pods_path),), lost_answers=True)  # fmt: skip
    with proxy.fault_window(storm):
        cluster.apply(training_job("storm", replicas=3, gpus=NO_GPUS, run_for="2s"), namespace)
        wait_for(
            lambda: any(e.injected and e.upstream_status == 201 for e in pod_creations()),
            timeout=120,
            what="a pod created whose answer the proxy replaced with an error",
        )
        # Retries come at least every 4 s and every third try of an endpoint gets through: the storm
        # lasts until its faults are served or the job is done; the wait only bounds a stuck operator.
        wait_for(
            lambda: (
                proxy.plan.injected >= storm.faults
                or job_status(cluster, namespace, "storm").get("phase") in ("Succeeded", "Failed")
            ),
            timeout=240,
            what=f"{storm.faults} faults served or the job finished",
        )
    injected = [e for e in proxy.exchanges() if e.injected]
    assert {429, 503} <= {e.status for e in injected}, "both kinds of error were served"
    assert any(e.upstream_status is None for e in injected), "some requests were refused outright"

    status = wait_phase(cluster, namespace, "storm", "Succeeded", timeout=60)
    assert status["attempt"] == 0 and status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}
    assert sorted(pod_uids(cluster, namespace, "storm")) == [f"storm-worker-{i}" for i in range(3)]
    created = [e for e in pod_creations() if e.upstream_status == 201]
    assert len(created) == 3, f"each pod created exactly once, the API server created {len(created)}"
    assert operator.proc is not None and operator.proc.poll() is None, "the operator survived the storm"
    # Either loop may meet the storm first: the admission pass or a reconcile; both say so and retry.
    retried = re.search(r"failed( \(\d+ in a row\))?, retrying", current_log(operator))
    assert retried, "the errors reached the control loops, which retried"


# -- 4. 409: a pod already holds the name the operator is about to create ---------------------------------


def squatter_pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod nobody owns, placed nowhere (it never binds), holding a worker pod's name."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"phalanx.dev/no-such-node": "true"},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "squatter", "image": "squatter:test"}],
        },
    }


def name_conflict(cluster: Cluster, ns: str, job: str) -> dict[str, Any]:
    status = job_status(cluster, ns, job)
    found = next((c for c in status.get("conditions") or [] if c["type"] == "PodsCreated"), {})
    return found if found.get("reason") == "NameConflict" else {}


def test_unowned_pod_with_the_jobs_labels_is_a_name_conflict_never_adopted_or_deleted(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # One rule everywhere: what this TrainingJob does not control is not its own, whatever its labels
    # (a job of the same name deleted with --cascade=orphan leaves such pods, with another job's uid
    # in their env). It is reported as a name conflict and left alone.
    labels = {"phalanx.dev/job-name": "held", "phalanx.dev/attempt": "0", "phalanx.dev/replica-index": "0"}
    cluster.apply(squatter_pod("held-worker-0", labels), namespace)
    squatter_uid = cluster.get_json("pod", "held-worker-0", "-n", namespace)["metadata"]["uid"]

    cluster.apply(training_job("held", replicas=2, gpus=NO_GPUS), namespace)
    conflict = wait_for(lambda: name_conflict(cluster, namespace, "held"), timeout=30, what="a name conflict")
    assert "held-worker-0" in conflict["message"], conflict
    assert any("held-worker-0" in e["message"] for e in events_of(cluster, namespace, "held")
               if e["reason"] == "NameConflict")  # fmt: skip
    time.sleep(3)
    assert cluster.get_json("pod", "held-worker-0", "-n", namespace)["metadata"]["uid"] == squatter_uid
    assert job_status(cluster, namespace, "held").get("phase") in (None, "Pending")

    cluster.kubectl("delete", "pod", "held-worker-0", "-n", namespace, "--wait=true")
    status = wait_phase(cluster, namespace, "held", "Running", timeout=30)
    job_uid = cluster.get_json("tj", "held", "-n", namespace)["metadata"]["uid"]
    worker0 = cluster.get_json("pod", "held-worker-0", "-n", namespace)["metadata"]
    assert worker0["uid"] != squatter_uid and worker0["ownerReferences"][0]["uid"] == job_uid
    assert status["attempt"] == 0 and status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}


def test_a_service_another_owner_controls_is_a_name_conflict_not_adopted(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "someone-else"}}
    cluster.apply(owner, namespace)
    owner_uid = cluster.get_json("configmap", "someone-else", "-n", namespace)["metadata"]["uid"]
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "svc", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "someone-else", "uid": owner_uid, "controller": True}
        ]},
        "spec": {"selector": {"app": "someone-else"}, "ports": [{"port": 80}]},
    }  # fmt: skip
    cluster.apply(service, namespace)
    cluster.apply(training_job("svc", replicas=2, gpus=NO_GPUS), namespace)

    # Its selector is not the job's: the workers' names would never resolve through it.
    conflict = wait_for(lambda: name_conflict(cluster, namespace, "svc"), timeout=30, what="a name conflict")
    assert "service svc" in conflict["message"], conflict
    assert any("service svc" in e["message"] for e in events_of(cluster, namespace, "svc")
               if e["reason"] == "NameConflict")  # fmt: skip
    assert not job_pods(cluster, namespace, "svc"), "no pod is created before the job has its Service"
    kept = cluster.get_json("service", "svc", "-n", namespace)
    assert kept["metadata"]["ownerReferences"][0]["uid"] == owner_uid

    cluster.kubectl("delete", "service", "svc", "-n", namespace, "--wait=true")
    wait_phase(cluster, namespace, "svc", "Running", timeout=30)
    job_uid = cluster.get_json("tj", "svc", "-n", namespace)["metadata"]["uid"]
    ours = cluster.get_json("service", "svc", "-n", namespace)
    assert ours["metadata"]["ownerReferences"][0]["uid"] == job_uid
    assert ours["spec"]["selector"] == {"phalanx.dev/job-name": "svc"}


def test_foreign_pod_holding_a_worker_name_blocks_only_until_it_is_deleted(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(squatter_pod("taken-worker-0", {"app": "someone-else"}), namespace)
    cluster.apply(training_job("taken", replicas=2, gpus=NO_GPUS), namespace)

    # The operator cannot create worker-0 (409) and must neither crash nor start half a gang.
    wait_for(lambda: exists(cluster, "pod", "taken-worker-1", "-n", namespace), timeout=30, what="worker-1")
    time.sleep(5)
    assert job_status(cluster, namespace, "taken").get("phase") in (None, "Pending")
    assert cluster.get_json("pod", "taken-worker-0", "-n", namespace)["metadata"]["labels"] == {
        "app": "someone-else"
    }, "the operator left the pod it does not own alone"
    assert operator.proc is not None and operator.proc.poll() is None

    cluster.kubectl("delete", "pod", "taken-worker-0", "-n", namespace, "--wait=true")
    wait_phase(cluster, namespace, "taken", "Running", timeout=30)
    job_uid = cluster.get_json("tj", "taken", "-n", namespace)["metadata"]["uid"]
    worker0 = cluster.get_json("pod", "taken-worker-0", "-n", namespace)["metadata"]
    assert worker0["ownerReferences"][0]["uid"] == job_uid
    assert job_status(cluster, namespace, "taken")["attempt"] == 0


def test_foreign_pod_holding_a_worker_name_is_reported_in_status_or_events(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(squatter_pod("blocked-worker-0", {"app": "someone-else"}), namespace)
    cluster.apply(training_job("blocked", replicas=2, gpus=NO_GPUS), namespace)

    def reported() -> bool:
        status = job_status(cluster, namespace, "blocked")
        texts = [status.get("message", "")] + [c.get("message", "") for c in status.get("conditions", [])]
        texts += [e["message"] for e in events_of(cluster, namespace, "blocked")]
        return any("blocked-worker-0" in t for t in texts)

    wait_for(reported, timeout=10, what="status or an event naming the pod that holds the name")


# -- 5. status written by someone else ---------------------------------------------------------------------


def test_stale_status_written_by_someone_else_is_corrected_on_the_next_pass(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(training_job("truth", replicas=2, gpus=NO_GPUS), namespace)
    truthful = wait_phase(cluster, namespace, "truth", "Running")
    uids = pod_uids(cluster, namespace, "truth")

    stale = {"status": {"phase": "Pending", "readySummary": "0/2", "message": "written by someone else"}}
    patched = cluster.kubectl(
        "patch", "tj", "truth", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(stale), "-o", "json",
    )  # fmt: skip
    written = json.loads(patched.stdout)["status"]
    assert (written["phase"], written["message"]) == ("Pending", "written by someone else"), "the lie landed"
    # The next pass comes from the write's own watch event, or from the 20 s resync at the latest.
    restored = wait_for(
        lambda: (
            (s := job_status(cluster, namespace, "truth")).get("phase") == "Running"
            and s.get("message") != "written by someone else"
            and s
        ),
        timeout=30,
        what="the operator restoring a truthful status",
    )
    assert restored["readySummary"] == "2/2" and restored["message"] == truthful["message"]
    assert restored["attempt"] == 0 and restored["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}
    assert pod_uids(cluster, namespace, "truth") == uids


# -- 6. decide, record, then act: a status write lost after a decision --------------------------------


@pytest.fixture
def operator_losing_status_writes(operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The shared operator, restarted so that its first status write per job to Failed or Restarting
    is lost before it reaches the API server."""
    operator.stop()
    operator.start(extra_env={"PHALANX_FAILPOINT_LOSE_STATUS_WRITE": "Failed,Restarting"})
    try:
        yield operator
    finally:
        operator.stop()
        operator.start()


def make_pod_exit(cluster: Cluster, ns: str, pod: str, code: int) -> None:
    """kwok ends the pod a second later with `code`, as if its trainer had exited."""
    cluster.kubectl("annotate", "pod", pod, "-n", ns, "--overwrite",
                    "phalanx.dev/sim-run-for=1s", f"phalanx.dev/sim-exit-code={code}")  # fmt: skip


def test_a_permanent_failure_whose_status_write_is_lost_still_fails_the_job(
    cluster: Cluster, namespace: str, operator_losing_status_writes: OperatorProcess
) -> None:
    job = training_job("doomed", replicas=2, gpus=NO_GPUS, runPolicy={"terminationGracePeriodSeconds": 1})
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "doomed", "Running")
    make_pod_exit(cluster, namespace, "doomed-worker-0", 1)
    # Had the operator stopped worker-1 before recording why, the next pass would read the missing
    # pod as someone else's deletion: a preemption, and a restart around the failure.
    status = wait_phase(cluster, namespace, "doomed", "Failed", timeout=60)
    assert status["attempt"] == 0 and status["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}, (
        status
    )
    assert "exited with code 1" in status["message"], status["message"]
    assert "failpoint: status write of" in current_log(operator_losing_status_writes), "the write was lost"


def test_a_retryable_failure_whose_status_write_is_lost_is_still_counted_as_a_failure(
    cluster: Cluster, namespace: str, operator_losing_status_writes: OperatorProcess
) -> None:
    job = training_job("flaky", replicas=2, gpus=NO_GPUS,
                       runPolicy={"terminationGracePeriodSeconds": 1, "retryableExitCodes": [42]})  # fmt: skip
    cluster.apply(job, namespace)
    wait_phase(cluster, namespace, "flaky", "Running")
    make_pod_exit(cluster, namespace, "flaky-worker-0", 42)
    status = wait_for(
        lambda: (s := job_status(cluster, namespace, "flaky")).get("attempt") == 1 and s,
        timeout=60,
        what="the gang restarted as attempt 1",
    )
    assert status["restarts"] == {"failures": 1, "preemptions": 0, "hangs": 0}, status
    status = wait_phase(cluster, namespace, "flaky", "Running", timeout=60)
    assert status["attempt"] == 1 and status["restarts"] == {"failures": 1, "preemptions": 0, "hangs": 0}, (
        status
    )
    assert "failpoint: status write of" in current_log(operator_losing_status_writes), "the write was lost"


# -- 7. pod creations the API server refuses -----------------------------------------------------------


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def test_a_pod_template_the_api_server_refuses_is_reported_in_status_and_an_event(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # Passes the CRD's schema, fails pod validation (422): requests above limits.
    job = training_job("invalid", replicas=2, gpus=NO_GPUS)
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "2"}, "limits": {"cpu": "1"}
    }  # fmt: skip
    cluster.apply(job, namespace)
    status = wait_for(
        lambda: (
            condition(s := job_status(cluster, namespace, "invalid"), "PodsCreated").get("status") == "False"
            and s
        ),
        timeout=30,
        what="PodsCreated=False",
    )
    refused = condition(status, "PodsCreated")
    assert refused["reason"] == "CreateRefused", refused
    assert "must be less than or equal to cpu limit" in refused["message"], refused["message"]
    warnings = [e for e in events_of(cluster, namespace, "invalid") if e["type"] == "Warning"]
    assert any(e["reason"] == "CreateRefused" and "cpu limit" in e["message"] for e in warnings), warnings
    assert not job_pods(cluster, namespace, "invalid")


def test_a_gang_the_resource_quota_admits_only_half_of_is_reported_and_torn_down_after_the_gang_timeout(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "one-pod"},
             "spec": {"hard": {"pods": "1"}}}  # fmt: skip
    cluster.apply(quota, namespace)
    # The quota admission plugin refuses every pod until the quota controller has counted usage.
    wait_for(lambda: cluster.get_json("resourcequota", "one-pod", "-n", namespace).get("status", {}).get("used"),
             timeout=30, what="quota usage counted")  # fmt: skip
    timeout = 10
    job = training_job("half", replicas=2, gpus=1, terminate_after="1s",
                       scheduling={"gang": {"timeoutSeconds": timeout}})  # fmt: skip
    cluster.apply(job, namespace)
    status = wait_for(
        lambda: (
            condition(s := job_status(cluster, namespace, "half"), "PodsCreated").get("status") == "False"
            and s
        ),
        timeout=30,
        what="PodsCreated=False",
    )
    refused = condition(status, "PodsCreated")
    assert refused["reason"] == "CreateRefused" and "exceeded quota" in refused["message"], refused
    (created,) = job_pods(cluster, namespace, "half")
    assert any(
        e["reason"] == "CreateRefused" and "exceeded quota" in e["message"]
        for e in events_of(cluster, namespace, "half")
    )
    # The half that exists holds its GPU for nothing: gone after the gang timeout, and retried later.
    torn = wait_for(
        lambda: (s := job_status(cluster, namespace, "half")).get("gangTimeouts") and s,
        timeout=timeout + 30,
        what="the partial gang torn down",
    )
    assert torn["attempt"] == 1 and torn["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 0}, torn
    said = wait_for(
        lambda: [e["message"] for e in events_of(cluster, namespace, "half") if e["reason"] == "GangTimeout"],
        timeout=10,
        what="a GangTimeout event",
    )
    assert any("only 1/2 pod(s) could be created" in m and "exceeded quota" in m for m in said), said
    wait_for(
        lambda: created["metadata"]["uid"] not in pod_uids(cluster, namespace, "half").values(),
        timeout=30,
        what="the created pod deleted",
    )
