"""A rank slowed on purpose on the dev node (PHALANX_FAULT_SLOW_RANK) gets the Straggler condition,
naming its pod and node, within the trainer's straggler_steps; its healthy peer never does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, OperatorProcess, RealNode, create_namespace, wait_for
from tests.e2e.runs import job_manifests, job_status, wait_job_phase

pytestmark = pytest.mark.e2e

STRAGGLER_STEPS = 20  # the trainer's metrics.straggler_steps default; the demo logs every step
RUN_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def straggler_namespace(cluster: Cluster) -> Iterator[str]:
    name = create_namespace(cluster, f"slow-{uuid.uuid4().hex[:6]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def straggler_condition(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Straggler"), None)


def test_a_rank_slowed_on_purpose_is_named_a_straggler_and_its_healthy_peer_never_is(
    cluster: Cluster, straggler_namespace: str, real_node: RealNode, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "slow"
    manifests = job_manifests(name, real_node, tmp_path, steps=160, interval=40, procs=1)
    trainer = manifests[1]["spec"]["template"]["spec"]["containers"][0]
    # Global rank 1 (worker-1) sleeps 50 ms before each forward pass: several times its peer's work.
    trainer.setdefault("env", []).append({"name": "PHALANX_FAULT_SLOW_RANK", "value": "1:0.05"})
    cluster.apply(manifests, straggler_namespace)

    seen: list[dict[str, Any]] = []

    def named() -> bool:
        status = job_status(cluster, straggler_namespace, name)
        seen.append(status)
        condition = straggler_condition(status)
        return condition is not None and condition["status"] == "True"

    wait_for(named, timeout=RUN_TIMEOUT, interval=0.5, what="the Straggler condition")
    status = seen[-1]
    (straggler,) = status["stragglers"]
    assert (straggler["rank"], straggler["pod"], straggler["node"]) == (1, f"{name}-worker-1", real_node.name)
    assert float(straggler["ratio"]) > 2.0 and straggler["steps"] >= STRAGGLER_STEPS
    # Named within straggler_steps of the first logged steps, give or take the 1 s polls.
    step = (status.get("progress") or {}).get("step") or 0
    assert step <= 3 * STRAGGLER_STEPS, step
    assert f"pod {name}-worker-1 on node {real_node.name}" in straggler_condition(status)["message"]  # type: ignore[index]

    assert (
        wait_job_phase(cluster, straggler_namespace, name, ("Succeeded", "Failed"), RUN_TIMEOUT)
        == "Succeeded"
    )
    events = cluster.get_json(
        "events", "-n", straggler_namespace, "--field-selector", f"involvedObject.name={name}"
    )
    warnings = [e["message"] for e in events["items"] if e["reason"] == "Straggler"]
    assert warnings and all("rank 0" not in message for message in warnings), warnings
