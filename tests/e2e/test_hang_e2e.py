"""A hung rank on the dev node (its pod's processes stopped with SIGSTOP): the operator sees rank 0's
step stop advancing, restarts the gang with reason Hang naming the silent pod, and the job resumes
from the newest periodic checkpoint and succeeds."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, OperatorProcess, RealNode, create_namespace, wait_for
from tests.e2e.runs import job_manifests, job_status, pod_uids, rank0_attempts, wait_for_step, wait_job_phase

pytestmark = pytest.mark.e2e

HANG_TIMEOUT = 15  # spec.runPolicy.hangTimeoutSeconds; the trainer's collective timeout is 45 s
# Detection: the bound, then up to one reconcile recheck and one progress poll (1 s) late, on a
# loaded machine.
DETECTED_WITHIN = HANG_TIMEOUT + 20
RUN_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def hang_namespace(cluster: Cluster) -> Iterator[str]:
    name = create_namespace(cluster, f"hang-{uuid.uuid4().hex[:6]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_a_stopped_rank_is_detected_within_the_bound_and_the_gang_recovers_counted_as_a_hang(
    cluster: Cluster, hang_namespace: str, real_node: RealNode, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = "hung"
    manifests = job_manifests(name, real_node, tmp_path, steps=160, interval=20, grace=5, procs=1,
                              run_policy={"hangTimeoutSeconds": HANG_TIMEOUT})  # fmt: skip
    cluster.apply(manifests, hang_namespace)
    wait_for_step(real_node, hang_namespace, name, 0, 30, timeout=RUN_TIMEOUT)
    wait_for(lambda: any(tmp_path.glob("step-*")), timeout=RUN_TIMEOUT, what="a committed checkpoint")
    wait_for(lambda: (job_status(cluster, hang_namespace, name).get("progress") or {}).get("step"),
             timeout=60, what="status.progress")  # fmt: skip

    uid = pod_uids(cluster, hang_namespace, name)[f"{name}-worker-1"]
    pgid = int((real_node.state_dir / "pods" / uid / "trainer.pid").read_text())
    os.killpg(pgid, signal.SIGSTOP)  # the whole pod: its trainer neither trains nor answers
    stopped_at = time.monotonic()
    try:
        wait_for(lambda: (job_status(cluster, hang_namespace, name).get("restarts") or {}).get("hangs") == 1,
                 timeout=DETECTED_WITHIN + 30, interval=0.5, what="a restart counted as a hang")  # fmt: skip
        detected_after = time.monotonic() - stopped_at
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)  # whatever the operator did, leave nothing stopped
    assert HANG_TIMEOUT <= detected_after <= DETECTED_WITHIN, detected_after

    status = job_status(cluster, hang_namespace, name)
    restarting = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert restarting["reason"] == "Hang"  # its message moves on to what the restart waits for
    events = cluster.get_json(
        "events", "-n", hang_namespace, "--field-selector", f"involvedObject.name={name}"
    )
    hangs = [e["message"] for e in events["items"] if e["reason"] == "Hang" and e["type"] == "Warning"]
    assert len(hangs) == 1 and f"not answering: {name}-worker-1" in hangs[0], hangs

    assert wait_job_phase(cluster, hang_namespace, name, ("Succeeded", "Failed"), RUN_TIMEOUT) == "Succeeded"
    final = job_status(cluster, hang_namespace, name)
    assert final["restarts"] == {"failures": 0, "preemptions": 0, "hangs": 1}
    assert final["lastRecovery"]["reason"] == "Hang"
    first, second = rank0_attempts(real_node, hang_namespace, name)[:2]
    assert second.resumed_from is not None and second.resumed_from > 0  # from a periodic checkpoint
    assert second.resumed_from <= first.last_step
