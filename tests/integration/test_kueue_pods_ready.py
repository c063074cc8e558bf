"""Kueue's waitForPodsReady with the gang (issue 18 item 2): with blockAdmission, Kueue admits the
next workload only once the admitted one reports PodsReady=True, and evicts it if that takes longer
than the timeout. The operator sets PodsReady when the whole gang runs, so two queued jobs start one
after the other, well within the timeout, and neither is evicted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from phalanx.devcluster.kueue import (
    KueueSettings,
    KueueState,
    WaitForPodsReady,
    kueue_state,
    resolve_kueue_dir,
    start_kueue,
    stop_kueue,
)
from tests.conftest import Cluster, OperatorProcess
from tests.integration.test_kueue_dev import condition
from tests.integration.test_kueue_workload import Queues, queued, wait_running, workload_of
from tests.jobs import job_status

pytestmark = pytest.mark.integration

TIMEOUT_SECONDS = 90


@pytest.fixture(scope="module")
def kueue(cluster: Cluster) -> Iterator[KueueState]:
    """This module's own Kueue, started with waitForPodsReady (blockAdmission)."""
    resolve_kueue_dir()
    if kueue_state(cluster.local) is not None:
        pytest.skip(
            "a Kueue already runs on this cluster (PHALANX_TEST_KUBECONFIG): its settings are its own"
        )
    settings = KueueSettings(wait_for_pods_ready=WaitForPodsReady(timeout_seconds=TIMEOUT_SECONDS))
    state = start_kueue(cluster.local, settings)
    try:
        yield state
    finally:
        stop_kueue(cluster.local, unregister=True)


@pytest.fixture
def queues(
    cluster: Cluster, namespace: str, kueue: KueueState, private_nodes: Any, operator: OperatorProcess
) -> Iterator[Queues]:
    private_nodes.add(2, gpus=8)
    q = Queues(cluster, namespace, private_nodes.placement())
    try:
        yield q
    finally:
        q.clean_up()


def transition(workload: dict[str, Any], type_: str) -> str:
    return next(str(c["lastTransitionTime"]) for c in workload["status"]["conditions"] if c["type"] == type_)


def test_the_gangs_pods_ready_lets_kueue_admit_the_next_job_before_its_timeout(
    cluster: Cluster, namespace: str, queues: Queues
) -> None:
    queues.gpu_queue(gpus=4)
    cluster.apply(queued("first"), namespace)
    cluster.apply(queued("second"), namespace)
    # Both well within the timeout: Kueue admitted the second only once the first said PodsReady.
    wait_running(cluster, namespace, "first", timeout=TIMEOUT_SECONDS / 2)
    wait_running(cluster, namespace, "second", timeout=TIMEOUT_SECONDS / 2)
    first, second = (workload_of(cluster, namespace, j) for j in ("first", "second"))
    assert first is not None and second is not None
    assert condition(first, "PodsReady") == "True" and condition(second, "PodsReady") == "True"
    # Which one Kueue took first is its choice; the other was admitted after the first was ready.
    earlier, later = sorted((first, second), key=lambda w: transition(w, "Admitted"))
    assert transition(earlier, "PodsReady") <= transition(later, "Admitted")
    for job in ("first", "second"):
        assert job_status(cluster, namespace, job)["restarts"]["preemptions"] == 0
