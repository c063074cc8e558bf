"""hostPath checkpoint volumes against the real control plane: refused without the operator's
--allow-host-path-checkpoints (the chart's default), created with it (the dev cluster's and tests')."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, OperatorProcess, wait_for
from tests.jobs import job_pods, job_status, training_job, wait_phase

pytestmark = pytest.mark.integration

REASON = "HostPathNotAllowed"


@pytest.fixture
def own_operator(
    cluster: Cluster, operator_process: OperatorProcess, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The session's operator steps aside; this test starts its own with the flags it needs (later
    tests restart the session's)."""
    operator_process.stop()
    candidate = OperatorProcess(cluster, tmp_path, Path(operator_process.kubeconfig))
    try:
        yield candidate
    finally:
        candidate.stop()


def refusal(cluster: Cluster, namespace: str, name: str) -> dict[str, str] | None:
    conditions = job_status(cluster, namespace, name).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodsCreated" and c.get("reason") == REASON), None)


def test_host_path_checkpoints_are_refused_without_the_flag_and_run_with_it(
    cluster: Cluster, namespace: str, own_operator: OperatorProcess
) -> None:
    own_operator.start(allow_host_path_checkpoints=False)
    job = training_job("hp", replicas=2, checkpoint={"volume": {"hostPath": {"path": "/tmp/phalanx-ckpt"}}})
    cluster.apply(job, namespace)

    condition = wait_for(lambda: refusal(cluster, namespace, "hp"), timeout=60, what="the hostPath refusal")
    assert condition["status"] == "False"
    assert "spec.checkpoint.volume.hostPath" in condition["message"]
    assert "--allow-host-path-checkpoints" in condition["message"]
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=hp")[
        "items"
    ]
    warned = [e for e in events if e["reason"] == REASON]
    assert (
        warned
        and warned[0]["type"] == "Warning"
        and "spec.checkpoint.volume.hostPath" in warned[0]["message"]
    )
    time.sleep(5)  # a few more reconciles (resyncs, kopf events) create nothing either
    assert job_pods(cluster, namespace, "hp") == []
    assert cluster.get_json("services", "-n", namespace)["items"] == []
    assert own_operator.proc is not None and own_operator.proc.poll() is None, (
        "the operator must keep running"
    )
    assert job_status(cluster, namespace, "hp").get("phase") not in ("Failed", "Succeeded")

    own_operator.stop()
    own_operator.start(allow_host_path_checkpoints=True)
    wait_phase(cluster, namespace, "hp", "Running")
    pods = job_pods(cluster, namespace, "hp")
    assert len(pods) == 2
    for pod in pods:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["phalanx-checkpoints"]["hostPath"]["path"] == "/tmp/phalanx-ckpt"
    created = next(
        c for c in job_status(cluster, namespace, "hp")["conditions"] if c["type"] == "PodsCreated"
    )
    assert created["status"] == "True", created
