"""KubeApi against the real API server: connections are reused across writes."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.k8s import KubeApi
from tests.conftest import Cluster
from tests.integration.test_reflector import plain_pod

pytestmark = pytest.mark.integration


def connections_opened(api_client: Any) -> int:
    pools = api_client.pool_manager.pools
    return sum(pools[key].num_connections for key in pools.keys())


def test_writes_whose_answer_is_not_read_still_return_their_connection_to_the_pool(
    cluster: Cluster, namespace: str
) -> None:
    # Events, pod deletions and job deletions do not read their answers. A connection left with an
    # unread body cannot be reused, so each such write used to cost the next request a new TLS
    # handshake, on the operator's side and the API server's.
    api_client = cluster.kube_client()
    kube = KubeApi(api_client)
    job = {"metadata": {"name": "owner", "namespace": namespace, "uid": "0000-test"}}
    for round_ in range(10):
        name = f"churn-{round_}"
        created = kube.create_if_absent(
            {**plain_pod(name), "metadata": {"name": name, "namespace": namespace}}
        )
        assert created is not None
        kube.create_event(job, "Normal", "Testing", f"round {round_}", "2026-11-30T00:00:00Z")
        kube.delete_pod(namespace, name, created["metadata"]["uid"], 0)
        kube.delete_job(namespace, "no-such-job", "0000-none")  # a 404, handled
    # 40 sequential requests from one thread: one connection serves them all.
    assert connections_opened(api_client) == 1
