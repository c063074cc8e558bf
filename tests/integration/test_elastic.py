"""Elastic gangs (spec.elastic, docs/elastic.md) on the dev cluster: a job with minReplicas 1 and
maxReplicas 2 starts on the one node that has room, grows to 2 once a second node appears and a
checkpoint is reported, and shrinks back to 1 when a node is lost and nothing can replace it.

One 8-GPU pod per node, on nodes only this test uses. No trainer runs on kwok, so the checkpoint is
written into status.lastCheckpoint the way the operator's progress poller would copy it in.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest

from tests.conftest import Cluster, OperatorProcess, silence_node, wait_for
from tests.integration.test_gang import NODE_LOST_AFTER_SECONDS, NODE_MONITOR_GRACE_SECONDS, pods_in
from tests.jobs import job_status, training_job, wait_phase

pytestmark = pytest.mark.integration

ELASTIC = {"minReplicas": 1, "maxReplicas": 2}


def attempt_pods(cluster: Cluster, ns: str, job: str, attempt: int) -> list[dict[str, Any]]:
    return [
        p for p in pods_in(cluster, ns, job) if p["metadata"]["labels"]["phalanx.dev/attempt"] == str(attempt)
    ]


def world_size(pod: dict[str, Any]) -> str:
    """WORLD_SIZE in the trainer's environment: pods x 8 processes (one per GPU)."""
    trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
    return str(next(e["value"] for e in trainer["env"] if e["name"] == "WORLD_SIZE"))


def running_at(cluster: Cluster, ns: str, job: str, attempt: int, size: int) -> dict[str, Any]:
    """The status once `attempt` runs with `size` pods, all Running."""
    status: dict[str, Any] = job_status(cluster, ns, job)
    if status.get("attempt") != attempt or status.get("phase") != "Running":
        return {}
    if status.get("currentReplicas") != size:
        return {}
    pods = attempt_pods(cluster, ns, job, attempt)
    return status if len(pods) == size and all(p["status"].get("phase") == "Running" for p in pods) else {}


def events_with(cluster: Cluster, ns: str, job: str, reason: str) -> list[str]:
    items = cluster.get_json("events", "-n", ns, "--field-selector", f"involvedObject.name={job}")["items"]
    return [str(e["message"]) for e in items if e["reason"] == reason]


def report_checkpoint(cluster: Cluster, ns: str, job: str, step: int) -> None:
    """What the progress poller copies in from rank 0's /progress: a checkpoint committed now, first
    seen by the operator now (observedTime, the operator's clock; this machine's here)."""
    now = dt.datetime.now(dt.UTC)
    saved, observed = now.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z", now.strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = {"status": {"lastCheckpoint": {"step": step, "time": saved, "observedTime": observed}}}
    cluster.kubectl(
        "patch", "tj", job, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )


def test_an_elastic_job_starts_at_what_fits_grows_at_a_checkpoint_and_shrinks_on_node_loss(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    (first,) = private_nodes.add(1, gpus=8, prefix="el")
    job = training_job("stretchy", gpus=8, placement=private_nodes.placement(), terminate_after="1s",
                       elastic=ELASTIC)  # fmt: skip
    del job["spec"]["replicas"]  # derived: maxReplicas
    cluster.apply(job, namespace)

    # 1. Only one pod fits: the job starts on one instead of waiting for two.
    status = wait_for(
        lambda: running_at(cluster, namespace, "stretchy", 0, 1), timeout=45, what="running on 1"
    )
    (only,) = attempt_pods(cluster, namespace, "stretchy", 0)
    assert only["spec"]["nodeName"] == first and world_size(only) == "8"

    # 2. Room appears. Without a checkpoint since admission the gang keeps running as it is...
    (second,) = private_nodes.add(1, gpus=8, prefix="el2")
    assert wait_for_nothing(cluster, namespace, "stretchy", seconds=8)
    # ... and grows at the next checkpoint: a full gang restart at 2, reason Resize.
    report_checkpoint(cluster, namespace, "stretchy", step=20)
    status = wait_for(lambda: running_at(cluster, namespace, "stretchy", 1, 2), timeout=45, what="grown to 2")
    assert status["restarts"]["resizes"] == 1
    assert status["restarts"]["failures"] == 0 and status["restarts"]["preemptions"] == 0
    grown = attempt_pods(cluster, namespace, "stretchy", 1)
    assert {p["spec"]["nodeName"] for p in grown} == {first, second}
    assert {world_size(p) for p in grown} == {"16"}
    assert any("growing from 1 towards 2" in m for m in events_with(cluster, namespace, "stretchy", "Resize"))
    assert any("grows from 1 to 2" in m for m in events_with(cluster, namespace, "stretchy", "Resized"))

    # 3. A node is lost (its kubelet stops heartbeating) and no other has room: the job shrinks to 1
    # on the node that is left instead of waiting for the lost one.
    silence_node(cluster, second)
    bound = NODE_MONITOR_GRACE_SECONDS + NODE_LOST_AFTER_SECONDS + 40
    status = wait_for(lambda: running_at(cluster, namespace, "stretchy", 2, 1), timeout=bound,
                      what="shrunk to 1")  # fmt: skip
    assert status["restarts"]["preemptions"] == 1 and status["restarts"]["failures"] == 0
    (left,) = attempt_pods(cluster, namespace, "stretchy", 2)
    assert left["spec"]["nodeName"] == first and world_size(left) == "8"
    shrunk = events_with(cluster, namespace, "stretchy", "Resized")
    assert any("shrinks from 2 to 1" in m for m in shrunk), shrunk
    wait_phase(cluster, namespace, "stretchy", "Running")


def wait_for_nothing(cluster: Cluster, ns: str, job: str, seconds: float) -> bool:
    """True when the job stays at attempt 0 for `seconds` (longer than its 5 s look for room)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if job_status(cluster, ns, job).get("attempt") != 0:
            return False
        time.sleep(0.5)
    return True


def test_an_operator_killed_after_the_first_pod_of_an_elastic_attempt_creates_the_rest_at_its_size(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    # Room for 2 of 4: the attempt is sized 2. The operator dies right after creating pod 0, before
    # any status write after the creates; the next one must not size the rest from spec.replicas.
    private_nodes.add(2, gpus=8, prefix="ek")
    operator.stop()
    operator.start(extra_env={"PHALANX_FAILPOINT_EXIT_AFTER_PODS": "1"})
    job = training_job("killed", gpus=8, placement=private_nodes.placement(),
                       elastic={"minReplicas": 1, "maxReplicas": 4})  # fmt: skip
    del job["spec"]["replicas"]
    cluster.apply(job, namespace)
    assert operator.proc is not None
    operator.proc.wait(timeout=120)  # the failpoint killed it after its first pod
    assert operator.proc.returncode == 3
    assert len(attempt_pods(cluster, namespace, "killed", 0)) == 1
    operator.start()
    # 14 s alone; over 60 s once in a fresh-clone run on two loaded workers: the bound only stops a stuck run.
    wait_for(lambda: running_at(cluster, namespace, "killed", 0, 2), timeout=180, what="running on 2")
    pods = attempt_pods(cluster, namespace, "killed", 0)
    assert sorted(world_size(p) for p in pods) == ["16", "16"]
    assert {p["metadata"]["labels"]["phalanx.dev/gang-size"] for p in pods} == {"2"}


def test_an_operator_killed_between_a_grow_decision_and_its_deletions_grows_once(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    # The grow is recorded (attempt 1, Restarting, resizes 1) and the operator dies before it deletes
    # attempt 0's pod: the next operator finishes that restart, neither growing twice nor counting it twice.
    (first,) = private_nodes.add(1, gpus=8, prefix="eg")
    operator.stop()
    operator.start(extra_env={"PHALANX_FAILPOINT_EXIT_AFTER_DECISION_WRITE": "Resize"})
    job = training_job("regrow", gpus=8, placement=private_nodes.placement(), terminate_after="1s",
                       elastic=ELASTIC)  # fmt: skip
    del job["spec"]["replicas"]
    cluster.apply(job, namespace)
    wait_for(lambda: running_at(cluster, namespace, "regrow", 0, 1), timeout=60, what="running on 1")
    private_nodes.add(1, gpus=8, prefix="eg2")
    report_checkpoint(cluster, namespace, "regrow", step=20)
    assert operator.proc is not None
    operator.proc.wait(timeout=120)  # the failpoint killed it after the grow's status write
    assert operator.proc.returncode == 3
    status = job_status(cluster, namespace, "regrow")
    assert status["attempt"] == 1 and status["phase"] == "Restarting" and status["restarts"]["resizes"] == 1
    (old,) = attempt_pods(cluster, namespace, "regrow", 0)
    assert not old["metadata"].get("deletionTimestamp")  # killed before the deletion
    operator.start()
    status = wait_for(lambda: running_at(cluster, namespace, "regrow", 1, 2), timeout=120, what="grown to 2")
    assert status["restarts"]["resizes"] == 1
    assert status["restarts"]["failures"] == 0 and status["restarts"]["preemptions"] == 0
    assert first in {p["spec"]["nodeName"] for p in attempt_pods(cluster, namespace, "regrow", 1)}
    wait_for(lambda: not attempt_pods(cluster, namespace, "regrow", 0), timeout=60, what="attempt 0 gone")


def test_an_operator_killed_after_the_status_write_of_a_resize_creates_the_attempt_at_that_size(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    # Attempt 1's size (2) is written, then the operator dies before creating its pods. Room for 3
    # appears meanwhile: the next operator creates the attempt at the size recorded, not at 3 (a pod
    # created at another size than the status says would split the gang), and does not grow it again
    # on the checkpoint seen before attempt 1 was admitted.
    private_nodes.add(1, gpus=8, prefix="er")
    job = training_job("resized", gpus=8, placement=private_nodes.placement(), terminate_after="1s",
                       elastic={"minReplicas": 1, "maxReplicas": 3})  # fmt: skip
    del job["spec"]["replicas"]
    cluster.apply(job, namespace)
    wait_for(lambda: running_at(cluster, namespace, "resized", 0, 1), timeout=60, what="running on 1")
    operator.stop()
    operator.start(extra_env={"PHALANX_FAILPOINT_EXIT_AFTER_DECISION_WRITE": "Resized"})
    private_nodes.add(1, gpus=8, prefix="er2")
    report_checkpoint(cluster, namespace, "resized", step=20)
    assert operator.proc is not None
    operator.proc.wait(timeout=120)  # the failpoint killed it after attempt 1's size was written
    assert operator.proc.returncode == 3
    status = job_status(cluster, namespace, "resized")
    assert status["attempt"] == 1 and status["sizedAttempt"] == 1 and status["currentReplicas"] == 2
    assert not attempt_pods(cluster, namespace, "resized", 1)
    private_nodes.add(1, gpus=8, prefix="er3")
    operator.start()
    status = wait_for(
        lambda: running_at(cluster, namespace, "resized", 1, 2), timeout=120, what="running on 2"
    )
    pods = attempt_pods(cluster, namespace, "resized", 1)
    assert {p["metadata"]["labels"]["phalanx.dev/gang-size"] for p in pods} == {"2"}
    assert {world_size(p) for p in pods} == {"16"}
    assert status["restarts"]["resizes"] == 1
    end = time.monotonic() + 8  # longer than its 5 s look for room: no second grow on the old checkpoint
    while time.monotonic() < end:
        assert job_status(cluster, namespace, "resized").get("attempt") == 1
        time.sleep(0.5)


def test_a_grow_keeps_its_room_while_its_old_pod_lingers_and_another_gang_does_not_grow_into_it(
    cluster: Cluster, namespace: str, operator: OperatorProcess, private_nodes: Any
) -> None:
    # The reconciler's own sequence: the grower grows into the one free node; its old pod takes 30 s
    # to stop (a long grace period), so the grower's teardown passes read the room again and create
    # nothing. The other gang, with a checkpoint too, must not restart to grow into the grower's node.
    private_nodes.add(1, gpus=8, prefix="ea")
    for name, stops_in in (("grower", "30s"), ("other", "1s")):
        job = training_job(name, gpus=8, placement=private_nodes.placement(), terminate_after=stops_in,
                           elastic=ELASTIC)  # fmt: skip
        del job["spec"]["replicas"]
        cluster.apply(job, namespace)
        wait_for(lambda n=name: running_at(cluster, namespace, n, 0, 1), timeout=60, what=f"{name} on 1")
        if name == "grower":
            private_nodes.add(1, gpus=8, prefix="eb")  # room for the other job's one pod
    private_nodes.add(1, gpus=8, prefix="ec")  # one free node: room for one grow
    report_checkpoint(cluster, namespace, "grower", step=20)
    wait_for(lambda: job_status(cluster, namespace, "grower").get("attempt") == 1, timeout=45, what="grow")
    report_checkpoint(cluster, namespace, "other", step=20)
    # Several of the grower's passes and of the other's 5 s looks for room, the old pod still stopping.
    end = time.monotonic() + 20
    while time.monotonic() < end:
        assert job_status(cluster, namespace, "other").get("attempt") == 0, "the other gang grew too"
        time.sleep(0.5)
    assert attempt_pods(cluster, namespace, "grower", 0), "the old pod stopped early: nothing was tested"
    wait_for(lambda: running_at(cluster, namespace, "grower", 1, 2), timeout=60, what="grower at 2")
    assert job_status(cluster, namespace, "other")["attempt"] == 0
