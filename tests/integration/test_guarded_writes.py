"""Writes name the object they are for: a TrainingJob deleted and re-created by name (`kubectl delete
-f` then `kubectl apply -f`) while a write for the old one is in flight starts clean.

The operator's writes either carry the resourceVersion they were decided on (a reconcile, a
preemption) or, for what is copied in without a decision (the trainer's progress, the admission
message), the uid of the job they were read for. The API server refuses either on a successor.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from phalanx import constants as c
from phalanx.controller import Controller
from phalanx.k8s import KubeApi, StatusConflict
from phalanx.settings import OperatorSettings
from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.jobs import job_pods, job_status, training_job, wait_phase

pytestmark = pytest.mark.integration

OLD_REPORT = {"step": 123, "total_steps": 1000, "loss": 2.5, "last_checkpoint": {"step": 100, "time": None}}


class ProgressHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = json.dumps(OLD_REPORT).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


@pytest.fixture
def trainer_progress(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A stand-in for rank 0's /progress endpoint on 127.0.0.1, at the port the operator polls."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), ProgressHandler)
    monkeypatch.setattr(c, "DEFAULT_METRICS_PORT", server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def uid_of(cluster: Cluster, ns: str, name: str) -> str:
    return str(cluster.get_json("tj", name, "-n", ns)["metadata"]["uid"])


def recreate(cluster: Cluster, ns: str, job: dict[str, Any]) -> str:
    """`kubectl delete` then `kubectl apply` of the same manifest; returns the successor's uid."""
    name = job["metadata"]["name"]
    old = uid_of(cluster, ns, name)
    cluster.kubectl("delete", "tj", name, "-n", ns, "--wait=true")
    cluster.apply(job, ns)
    new = uid_of(cluster, ns, name)
    assert new != old
    return new


def test_a_progress_report_read_for_a_deleted_job_never_lands_on_its_successor(
    cluster: Cluster, crd_installed: None, namespace: str, trainer_progress: int
) -> None:
    job = training_job("reborn", replicas=1, gpus=None)
    cluster.apply(job, namespace)
    old_uid = uid_of(cluster, namespace, "reborn")
    key = f"{namespace}/reborn"
    controller = Controller(KubeApi(cluster.kube_client()), OperatorSettings(namespaces=(namespace,)))
    rank0 = {
        "metadata": {"labels": {c.LABEL_REPLICA_INDEX: "0", c.LABEL_ATTEMPT: "0"}},
        "status": {"podIP": "127.0.0.1"},
    }
    # The old job's rank 0 is being polled: the poll has its address when the job is replaced.
    controller.progress.track(key, old_uid, [rank0], {"attempt": 0, "phase": "Running"})
    recreate(cluster, namespace, job)

    controller.progress.poll(key)

    status = job_status(cluster, namespace, "reborn")
    assert "progress" not in status and "lastCheckpoint" not in status, status
    # And the poll lets go of the old job's address instead of trying again.
    assert key not in controller.progress.targets


def test_a_status_write_for_a_deleted_job_is_refused_on_its_successor(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    job = training_job("twin", replicas=1, gpus=None)
    cluster.apply(job, namespace)
    old = cluster.get_json("tj", "twin", "-n", namespace)["metadata"]
    new_uid = recreate(cluster, namespace, job)
    api = KubeApi(cluster.kube_client())

    # A decision made on the old job: its version is a precondition the successor never meets.
    with pytest.raises(StatusConflict):
        api.patch_job_status(namespace, "twin", {"phase": "Failed"}, old["resourceVersion"])
    # Facts read for the old job, with the old version or none known: refused by uid.
    for version in (old["resourceVersion"], None):
        assert (
            api.patch_job_facts(namespace, "twin", {"admissionMessage": "old"}, old["uid"], version) is None
        )
    assert "admissionMessage" not in job_status(cluster, namespace, "twin")
    assert job_status(cluster, namespace, "twin").get("phase") != "Failed"

    # The successor's own facts land, whatever version the writer had.
    stored = api.patch_job_facts(
        namespace, "twin", {"admissionMessage": "new"}, new_uid, old["resourceVersion"]
    )
    # The job as this write stored it: an operator of an earlier test still running on this cluster
    # may rewrite the successor's status right after (a re-read here failed once that way).
    assert stored is not None and stored["metadata"]["uid"] == new_uid
    assert stored["status"]["admissionMessage"] == "new"


def test_a_fact_written_without_retry_is_refused_over_a_newer_version_of_the_same_job(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    # Why a gang waits, decided on a copy of the job the gang's admission has since changed: written
    # over the newer version it would bring back a message the reconcile had cleared.
    cluster.apply(training_job("moved", replicas=1, gpus=None), namespace)
    seen = cluster.get_json("tj", "moved", "-n", namespace)["metadata"]
    api = KubeApi(cluster.kube_client())
    newer = api.patch_job_facts(namespace, "moved", {"progress": {"step": 1}}, seen["uid"], None)
    assert newer is not None and newer["metadata"]["resourceVersion"] != seen["resourceVersion"]
    with pytest.raises(StatusConflict):
        api.patch_job_facts(
            namespace, "moved", {"admissionMessage": "stale"}, seen["uid"], seen["resourceVersion"],
            retry_on_conflict=False,
        )  # fmt: skip
    assert "admissionMessage" not in job_status(cluster, namespace, "moved")
    # Decided on the current version, it lands (read again if an operator still running on this
    # cluster wrote the job in between).
    for _ in range(5):
        current = api.get_job(namespace, "moved")
        assert current is not None
        try:
            stored = api.patch_job_facts(
                namespace, "moved", {"admissionMessage": "fresh"}, seen["uid"],
                current["metadata"]["resourceVersion"], retry_on_conflict=False,
            )  # fmt: skip
        except StatusConflict:
            continue
        assert stored is not None and stored["status"]["admissionMessage"] == "fresh"
        break
    else:
        pytest.fail("five writes on the current version all met a newer one")


def test_a_deletion_decided_for_a_deleted_job_never_deletes_its_successor(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    # A finished job's TTL runs out while the user re-creates it: the deletion was for the old one.
    job = training_job("ttl", replicas=1, gpus=None)
    cluster.apply(job, namespace)
    old_uid = uid_of(cluster, namespace, "ttl")
    new_uid = recreate(cluster, namespace, job)

    KubeApi(cluster.kube_client()).delete_job(namespace, "ttl", old_uid)

    assert uid_of(cluster, namespace, "ttl") == new_uid


def test_a_job_recreated_by_name_while_restarting_starts_clean(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    # Pods that fail with a retryable code make the operator restart the gang, writing attempt and
    # restart counts; the job is re-created in the middle of that.
    flaky = training_job("again", replicas=2, gpus=None, run_for="1s", exit_code=137, terminate_after="1s",
                         runPolicy={"backoffLimit": 5})  # fmt: skip
    cluster.apply(flaky, namespace)
    wait_for(lambda: (job_status(cluster, namespace, "again").get("restarts") or {}).get("failures", 0) >= 1,
             timeout=60, what="a first restart")  # fmt: skip
    steady = training_job("again", replicas=2, gpus=None, terminate_after="1s")
    new_uid = recreate(cluster, namespace, steady)

    status = wait_phase(cluster, namespace, "again", "Running", timeout=60)

    assert status.get("attempt", 0) == 0, status
    assert status.get("restarts", {}) in ({}, {"failures": 0, "preemptions": 0, "hangs": 0}), status
    assert not [x for x in status.get("conditions", []) if x["type"] in ("Failed", "Preempted")], status
    current = [p for p in job_pods(cluster, namespace, "again") if not p["metadata"].get("deletionTimestamp")]
    assert current and all(p["metadata"]["ownerReferences"][0]["uid"] == new_uid for p in current)
