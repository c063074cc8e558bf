"""An elastic job (spec.elastic, docs/elastic.md) with real training on the dev node: it starts at the
size that fits, grows when room appears after a checkpoint, resumes from that checkpoint at the new
world size, and keeps the global batch constant (data.global_batch_size; docs/trainer.md, "Elastic
resize"), as the trainer's own start lines say.

The room is made scarce by a blocker pod on the dev node that asks for the node's free CPU less
what one of the job's pods needs. The shrink after a lost node, with real training on two dev nodes,
is in test_elastic_shrink_e2e.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, OperatorProcess, RealNode, create_namespace, wait_for
from tests.e2e.runs import POD_CPU, blocker, free_millicores, job_manifests, job_status, wait_job_phase
from tests.event_lines import json_events

pytestmark = pytest.mark.e2e

STEPS = 120
INTERVAL = 10
GLOBAL_BATCH = 32  # batch_size 8: 2 micro-steps on 2 ranks (1 pod x 2 processes), 1 on 4 ranks
TIMEOUT = 300.0


def trainer_events(node: RealNode, namespace: str, pod: str, event: str) -> list[dict[str, Any]]:
    return [e for e in json_events(node.log(namespace, pod, "trainer")) if e["event"] == event]


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = create_namespace(cluster, f"e2e-elastic-{uuid.uuid4().hex[:6]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_an_elastic_job_starts_small_grows_at_a_checkpoint_and_keeps_its_global_batch(
    cluster: Cluster,
    namespace: str,
    real_node: RealNode,
    operator_process: OperatorProcess,
    tmp_path: Path,
) -> None:
    operator_process.ensure_running()
    # Room for one of the job's pods, not two.
    spare = free_millicores(cluster, real_node.name) - int(POD_CPU * 1000 * 1.5)
    assert spare > 0, "the dev node has no CPU to spare for the blocker"
    cluster.apply(blocker(real_node, spare), namespace)
    wait_for(lambda: cluster.get_json("pod", "blocker", "-n", namespace)["status"].get("phase") == "Running",
             timeout=60, what="the blocker running")  # fmt: skip

    config_map, job = job_manifests(
        "elastic", real_node, tmp_path, steps=STEPS, interval=INTERVAL, replicas=2
    )
    del job["spec"]["replicas"]  # derived: maxReplicas
    job["spec"]["elastic"] = {"minReplicas": 1, "maxReplicas": 2}
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    trainer["args"] = [*trainer["args"], f"data.global_batch_size={GLOBAL_BATCH}"]
    cluster.apply([config_map, job], namespace)

    status = wait_for(
        lambda: (s := job_status(cluster, namespace, "elastic")).get("phase") == "Running" and s,
        timeout=TIMEOUT, what="the elastic job running",
    )  # fmt: skip
    assert status["currentReplicas"] == 1, status
    wait_for(lambda: (job_status(cluster, namespace, "elastic").get("lastCheckpoint") or {}).get("step"),
             timeout=TIMEOUT, what="a checkpoint of the one-pod attempt")  # fmt: skip

    cluster.kubectl("delete", "pod", "blocker", "-n", namespace, "--grace-period=0", "--force")
    grown = wait_for(
        lambda: (s := job_status(cluster, namespace, "elastic")).get("currentReplicas") == 2
        and s.get("phase") == "Running" and s,
        timeout=TIMEOUT, what="the job grown to 2 pods and running",
    )  # fmt: skip
    assert (grown.get("restarts") or {}).get("resizes") == 1, grown["restarts"]
    assert int((grown.get("restarts") or {}).get("failures") or 0) == 0

    def job_event_reasons() -> list[str]:
        return [e["reason"] for e in cluster.get_json("events", "-n", namespace)["items"]
                if e["involvedObject"].get("kind") == "TrainingJob" and e["involvedObject"].get("name") == "elastic"]  # fmt: skip

    # Events are recorded after the status write that made the change.
    wait_for(lambda: "Resized" in job_event_reasons(), timeout=30, what="a Resized event")

    final = wait_job_phase(cluster, namespace, "elastic", ("Succeeded", "Failed"), timeout=TIMEOUT)
    assert final == "Succeeded", job_status(cluster, namespace, "elastic")
    starts = trainer_events(real_node, namespace, "elastic-worker-0", "start")
    assert [s["world_size"] for s in starts] == [2, 4], starts
    # The same sequences per optimizer step at both sizes: the accumulation followed the world size.
    assert {s["global_batch_size"] for s in starts} == {GLOBAL_BATCH}, starts
    assert [s["grad_accumulation_steps"] for s in starts] == [2, 1], starts
    [resumed] = trainer_events(real_node, namespace, "elastic-worker-0", "resumed")
    assert resumed["from_world_size"] == 2 and resumed["step"] >= INTERVAL, resumed
    # Only rank 0 writes the JSON event log: the second pod is read from its spec and its exit.
    second = cluster.get_json("pod", "elastic-worker-1", "-n", namespace)
    env = {e["name"]: e.get("value") for e in second["spec"]["containers"][0]["env"]}
    assert env["WORLD_SIZE"] == "4" and second["status"]["phase"] == "Succeeded", second["status"]
