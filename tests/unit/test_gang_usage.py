"""The incremental usage index answers what summing over every pod answers, change after change."""

from __future__ import annotations

import random
from typing import Any

import pytest

from phalanx import constants as c
from phalanx.cache import Store, slim_pod
from phalanx.gang.capacity import usage_by_node
from phalanx.gang.on_creation import planned_nodes, someone_waits
from phalanx.gang.usage import UsageIndex

pytestmark = pytest.mark.unit

NODES = ("a", "b", "c")


def without_zeros(used: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    nonzero = {node: {k: v for k, v in totals.items() if v} for node, totals in used.items()}
    return {node: totals for node, totals in nonzero.items() if totals}


def random_pod(rng: random.Random, name: str, version: int) -> dict[str, Any]:
    """Any state a pod passes through: gated, admitted (pinned), bound, finished, deleting."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "trainer",
                "resources": {
                    "requests": {"cpu": rng.choice(["100m", "1", "2"]), "memory": "1Gi"},
                    "limits": {"nvidia.com/gpu": str(rng.randint(0, 2))},
                },
            }
        ]
    }
    state = rng.choice(["gated", "admitted", "bound", "finished", "bound-elsewhere"])
    if state == "gated":
        spec["schedulingGates"] = [{"name": c.GANG_SCHEDULING_GATE}]
    if state in ("admitted", "bound", "finished"):
        spec["nodeSelector"] = {"kubernetes.io/hostname": rng.choice(NODES)}
    if state in ("bound", "finished", "bound-elsewhere"):
        spec["nodeName"] = rng.choice(NODES)
    phase = {"finished": rng.choice(["Succeeded", "Failed"]), "bound": "Running"}.get(state, "Pending")
    labels = {c.LABEL_JOB_NAME: "job"} if rng.random() < 0.5 else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(version), "labels": labels},
        "spec": spec,
        "status": {"phase": phase},
    }


def test_index_matches_the_sum_over_every_pod_through_creates_updates_deletes_and_relists() -> None:
    rng = random.Random(11)
    index = UsageIndex()
    store = Store(slim_pod, observer=index)
    store.replace([], 0)
    version = 0
    for step in range(600):
        version += 1
        name = f"p{rng.randint(0, 30)}"
        roll = rng.random()
        if roll < 0.2 and store.get(f"ns/{name}") is not None:
            store.delete({"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(version)}})
        elif roll < 0.23:
            # A re-list after a broken watch: the store, and so the index, start again from it.
            relisted = [random_pod(rng, f"p{i}", version) for i in range(rng.randint(0, 30))]
            store.replace(relisted, version)
        else:
            store.upsert(random_pod(rng, name, version))
        pods = store.items()
        assert index.used() == without_zeros(usage_by_node(pods, planned_nodes(pods))), f"step {step}"
        assert index.anyone_waits() == someone_waits(pods, {}), f"step {step}"


def test_used_returns_a_copy_the_caller_may_change() -> None:
    index = UsageIndex()
    pod = random_pod(random.Random(1), "x", 1)
    pod["spec"].update(nodeName="a", schedulingGates=[])
    pod["status"]["phase"] = "Running"
    index.changed("ns/x", slim_pod(pod))
    used = index.used()
    used["a"]["cpu"] = -1
    assert index.used()["a"]["cpu"] > 0
