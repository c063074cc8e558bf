"""A bring-your-own trainer on the dev node: the plain `torchrun` example (examples/torchrun/) with
restartStrategy InPlace and inPlaceLauncher Torchrun. One worker is evicted: the other pod and its
torchrun agent stay, only the evicted pod is replaced, the agents re-form the gang and the script
resumes from its newest checkpoint with the losses it had (its data depends on the step only)."""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx.ports import free_port
from tests.conftest import Cluster, OperatorProcess, RealNode, create_namespace, wait_for
from tests.e2e.runs import REPO_ROOT, evict, job_status, pod_uids, wait_job_phase

pytestmark = pytest.mark.e2e

EXAMPLE = REPO_ROOT / "examples" / "torchrun" / "trainingjob.yaml"
STEPS = 300
RUN_TIMEOUT = 300.0
STEP_LINE = re.compile(r"^step (\d+) loss ([0-9.]+)", re.MULTILINE)


@pytest.fixture(scope="module")
def torchrun_namespace(cluster: Cluster) -> Iterator[str]:
    name = create_namespace(cluster, f"torchrun-{uuid.uuid4().hex[:6]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def example_manifests(node: RealNode, checkpoints: Path) -> list[dict[str, Any]]:
    config_map, job = copy.deepcopy(list(yaml.safe_load_all(EXAMPLE.read_text())))
    spec = job["spec"]
    spec["checkpoint"]["volume"] = {"hostPath": {"path": str(checkpoints), "type": "DirectoryOrCreate"}}
    spec["rendezvous"]["port"] = free_port()
    pod_spec = spec["template"]["spec"]
    pod_spec.pop("nodeSelector", None)
    pod_spec.pop("tolerations", None)
    pod_spec.update(node.placement())
    trainer = pod_spec["containers"][0]
    trainer["args"] = ["--steps", str(STEPS), "--step-seconds", "0.05"]
    return [config_map, job]


def steps_logged(node: RealNode, namespace: str, name: str) -> list[tuple[int, float]]:
    text = node.log(namespace, f"{name}-worker-0", "trainer")
    return [(int(step), float(loss)) for step, loss in STEP_LINE.findall(text)]


def test_an_evicted_torchrun_worker_is_replaced_alone_and_the_job_resumes_in_place(
    cluster: Cluster, torchrun_namespace: str, real_node: RealNode, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "torchrun-ddp"
    cluster.apply(example_manifests(real_node, tmp_path), torchrun_namespace)
    wait_for(lambda: any(step >= 60 for step, _ in steps_logged(real_node, torchrun_namespace, name)),
             timeout=RUN_TIMEOUT, interval=0.5, what="step 60")  # fmt: skip
    wait_for(lambda: any(tmp_path.iterdir()), timeout=60, what="a checkpoint")
    before = pod_uids(cluster, torchrun_namespace, name)
    evict(cluster, torchrun_namespace, f"{name}-worker-1")

    assert (
        wait_job_phase(cluster, torchrun_namespace, name, ("Succeeded", "Failed"), RUN_TIMEOUT) == "Succeeded"
    )
    after = pod_uids(cluster, torchrun_namespace, name)
    assert after[f"{name}-worker-0"] == before[f"{name}-worker-0"]  # kept, with its agent
    assert after[f"{name}-worker-1"] != before[f"{name}-worker-1"]  # the one replaced
    status = job_status(cluster, torchrun_namespace, name)
    assert status["restarts"] == {"failures": 0, "preemptions": 1, "hangs": 0}
    assert status["lastRecovery"]["path"] == "InPlace", status["lastRecovery"]
    events = cluster.get_json(
        "events", "-n", torchrun_namespace, "--field-selector", f"involvedObject.name={name}"
    )
    assert not [e for e in events["items"] if e["reason"] == "InPlaceFallback"]

    logged = steps_logged(real_node, torchrun_namespace, name)
    assert max(step for step, _ in logged) == STEPS
    first: dict[int, float] = {}
    for step, loss in logged:  # steps redone after the resume give the losses they gave before
        assert first.setdefault(step, loss) == pytest.approx(loss, abs=1e-6), step
    assert set(range(1, STEPS + 1)) <= set(first)  # no step skipped
