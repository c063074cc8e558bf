"""The operator's list-then-watch stores against the real API server."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from phalanx import reflector
from phalanx.cache import Slim, Store, slim_node, slim_pod
from phalanx.k8s import KubeApi
from phalanx.reflector import Reflector
from tests.conftest import Cluster, wait_for

pytestmark = pytest.mark.integration


def plain_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                                 "resources": {"requests": {"cpu": "100m"}}}],
                 "nodeSelector": {"no-such-node": "true"}},
    }  # fmt: skip


def test_pods_are_listed_in_pages_then_watched_through_create_and_delete(
    cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reflector, "LIST_PAGE_SIZE", 2)  # three pods: two pages at least
    cluster.apply([plain_pod(f"before-{i}") for i in range(3)], namespace)
    changes: list[tuple[str, bool, bool]] = []
    lock = threading.Lock()

    def record(key: str, old: Slim | None, new: Slim | None) -> None:
        with lock:
            changes.append((key, old is not None, new is not None))

    store = Store(slim_pod)
    watcher = Reflector("pods", KubeApi(cluster.kube_client()).pods_request, store, record).start()
    try:
        wait_for(store.synced.is_set, timeout=30, what="first list")
        listed = {k for k in store.as_dict() if k.startswith(f"{namespace}/")}
        assert listed == {f"{namespace}/before-{i}" for i in range(3)}

        cluster.apply(plain_pod("after"), namespace)
        wait_for(lambda: store.get(f"{namespace}/after") is not None, timeout=30, what="watched create")
        held = store.get(f"{namespace}/after")
        assert held is not None and held["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "100m"

        cluster.kubectl("delete", "pod", "before-0", "-n", namespace, "--grace-period=0", "--force")
        wait_for(lambda: store.get(f"{namespace}/before-0") is None, timeout=30, what="watched delete")
        with lock:
            assert (f"{namespace}/before-0", True, False) in changes
            assert (f"{namespace}/after", False, True) in changes
    finally:
        watcher.stop()


def test_nodes_store_matches_the_cluster(cluster: Cluster) -> None:
    store = Store(slim_node)
    watcher = Reflector("nodes", KubeApi(cluster.kube_client()).nodes_request, store).start()
    try:
        wait_for(store.synced.is_set, timeout=30, what="first list")
        nodes = {n["metadata"]["name"]: n for n in cluster.get_json("nodes")["items"]}
        wait_for(lambda: set(nodes) <= set(store.as_dict()), timeout=30, what="every node in the store")
        for name, node in nodes.items():
            held = store.get(name)
            # As the API has it (a node another test just created may have no status yet).
            assert held is not None, name
            allocatable = (node.get("status") or {}).get("allocatable")
            if allocatable:
                assert (held.get("status") or {}).get("allocatable") == allocatable, name
    finally:
        watcher.stop()


def test_one_job_store_fed_by_two_namespaces_keeps_both_across_a_relist(
    cluster: Cluster, namespace: str, crd_installed: None
) -> None:
    """The operator watching namespaces a and b: one reflector each, one store. Each list (the first,
    and the one after a dropped watch) is the truth for its own namespace only."""
    import uuid

    from phalanx.cache import slim_job
    from tests.conftest import create_namespace
    from tests.jobs import training_job

    other = create_namespace(cluster, f"{namespace[:50]}-b{uuid.uuid4().hex[:3]}")
    try:
        cluster.apply(training_job("job-a", gpus=None), namespace)
        cluster.apply(training_job("job-b", gpus=None), other)
        api = KubeApi(cluster.kube_client())
        store = Store(slim_job)
        # Built as the operator builds them (Controller.start).
        watchers = [
            w.start()
            for w in reflector.per_namespace("trainingjobs", api.jobs_request, store, [namespace, other])
        ]
        both = {f"{namespace}/job-a", f"{other}/job-b"}
        try:
            wait_for(lambda: both <= store.as_dict().keys(), timeout=30, what="both namespaces listed")
            relists = store_replacements(store)
            # A dropped connection: b's watch fails and b lists again (the reflector's error path).
            wait_for(lambda: watchers[1]._response is not None, timeout=30, what="b watching")
            watchers[1]._interrupt_watch()
            wait_for(lambda: relists() >= 1, timeout=30, what="b to list again")
            assert both <= store.as_dict().keys(), sorted(store.as_dict())
            cluster.apply(training_job("job-a2", gpus=None), namespace)
            wait_for(lambda: store.get(f"{namespace}/job-a2") is not None, timeout=30, what="a still watched")
            assert both <= store.as_dict().keys(), sorted(store.as_dict())
        finally:
            for watcher in watchers:
                watcher.stop()
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def store_replacements(store: Store) -> Any:
    """Counts the store's full lists from now on (wraps Store.replace_slimmed on this one instance)."""
    calls = [0]
    original = store.replace_slimmed

    def counting(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        calls[0] += 1

    store.replace_slimmed = counting  # type: ignore[method-assign]
    return lambda: calls[0]
