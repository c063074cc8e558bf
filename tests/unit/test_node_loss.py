"""When a node counts as lost, and how the next attempt's pods are named (policy/node_loss.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.builders.names import worker_fqdn, worker_hostname, worker_pod_name
from phalanx.builders.pods import JobRef, build_worker_pod
from phalanx.policy.node_loss import (
    DEFAULT_NODE_LOST_AFTER_SECONDS,
    attempt_in_names,
    lost_node_names,
    not_ready_since,
    on_lost_node,
    seconds_until_lost,
)
from phalanx.reconcile.plan import iso

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0


def node(status: str, since: float | None = None) -> dict[str, Any]:
    ready: dict[str, Any] = {"type": "Ready", "status": status}
    if since is not None:
        ready["lastTransitionTime"] = iso(since)
    return {"status": {"conditions": [ready]}}


def test_the_default_bound_is_well_under_a_minute() -> None:
    assert 0 < DEFAULT_NODE_LOST_AFTER_SECONDS < 60


def test_a_node_is_lost_once_not_ready_for_the_bound_whether_false_or_unknown() -> None:
    nodes = {
        "ready": node("True", NOW - 900),
        "unknown-long": node("Unknown", NOW - 21),
        "false-long": node("False", NOW - 20),
        "unknown-short": node("Unknown", NOW - 5),
        "never-reported": {"status": {}},
        "no-time": node("Unknown"),
    }
    assert lost_node_names(nodes, NOW, 20) == {"unknown-long", "false-long"}
    assert seconds_until_lost(nodes["unknown-short"], NOW, 20) == pytest.approx(15)
    assert seconds_until_lost(nodes["ready"], NOW, 20) is None
    assert not_ready_since(nodes["false-long"]) == NOW - 20
    assert lost_node_names(nodes, NOW, 0) == {"unknown-long", "false-long", "unknown-short"}


def test_pods_count_as_lost_on_lost_or_vanished_nodes_but_not_while_nodes_are_unknown() -> None:
    nodes = {"a": node("True"), "b": node("Unknown", NOW - 60)}
    lost = lost_node_names(nodes, NOW, 20)

    def on(name: str) -> dict[str, Any]:
        return {"spec": {"nodeName": name}}

    assert [on_lost_node(on(n), nodes, lost) for n in ("a", "b", "gone")] == [False, True, True]
    assert on_lost_node({"spec": {}}, nodes, lost) is False
    assert on_lost_node(on("gone"), {}, frozenset()) is False  # the node store is not listed yet


def test_an_attempt_takes_its_own_names_only_while_older_pods_linger_and_keeps_its_first_choice() -> None:
    def named(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}}

    lingering = [named("j-worker-1")]
    assert attempt_in_names([], [], 3) is False
    assert attempt_in_names([], lingering, 3) is True
    # Some pods of the attempt exist (a crash between creations): the rest follow them.
    assert attempt_in_names([named("j-worker-0-a3")], [], 3) is True
    assert attempt_in_names([named("j-worker-0")], lingering, 3) is False


def test_attempt_names_give_the_pod_its_own_name_hostname_and_rendezvous_address() -> None:
    spec = parse(
        TrainingJobSpec, {"replicas": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}}
    )
    ref = JobRef("j", "ns", "uid")
    template = {"spec": {"containers": [{"name": "trainer"}]}}
    plain = build_worker_pod(ref, spec, 1, 2, template)
    renamed = build_worker_pod(ref, spec, 1, 2, template, attempt_in_name=True)
    assert plain["metadata"]["name"] == plain["spec"]["hostname"] == "j-worker-1"
    assert renamed["metadata"]["name"] == renamed["spec"]["hostname"] == "j-worker-1-a2"
    env = {e["name"]: e["value"] for e in renamed["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "j-worker-0-a2.j.ns.svc.cluster.local"
    assert env["PHALANX_ATTEMPT"] == "2"


def test_a_long_job_name_still_gets_a_hostname_that_fits_a_dns_label() -> None:
    job = "x" * 50
    assert len(worker_pod_name(job, 999, 12345)) > 63
    host = worker_hostname(job, 999, 12345)
    assert host == "worker-999-a12345" and len(host) <= 63
    assert worker_fqdn(job, "ns", 0, attempt=7).startswith(f"{job}-worker-0-a7.{job}.ns.svc")
    assert worker_hostname(job, 999) == f"{job}-worker-999"


def test_the_operator_setting_is_read_from_its_environment_and_refused_when_not_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from phalanx.settings import node_lost_after_from_env

    monkeypatch.delenv("PHALANX_NODE_LOST_AFTER_SECONDS", raising=False)
    assert node_lost_after_from_env() == DEFAULT_NODE_LOST_AFTER_SECONDS
    monkeypatch.setenv("PHALANX_NODE_LOST_AFTER_SECONDS", "45")
    assert node_lost_after_from_env() == 45.0
    for bad in ("soon", "-1"):
        monkeypatch.setenv("PHALANX_NODE_LOST_AFTER_SECONDS", bad)
        with pytest.raises(ValueError, match="PHALANX_NODE_LOST_AFTER_SECONDS.*seconds >= 0"):
            node_lost_after_from_env()


def test_the_operators_slim_copy_of_a_node_still_tells_since_when_it_is_not_ready() -> None:
    from phalanx.cache import slim_node

    silent = {"metadata": {"name": "s", "resourceVersion": "3"}, **node("Unknown", NOW - 30)}
    silent["status"]["conditions"][0]["lastHeartbeatTime"] = iso(NOW - 70)
    assert lost_node_names({"s": slim_node(silent)}, NOW, 20) == {"s"}


def test_the_next_attempt_is_kept_off_the_lost_node_by_a_required_affinity_that_pinning_narrows() -> None:
    from phalanx.builders.pods import admitted_pod
    from phalanx.gang.capacity import NodeInfo, PodDemand, placement_refusal
    from phalanx.pod_facts import pinned_node

    spec = parse(
        TrainingJobSpec, {"replicas": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}}
    )
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
    template = {
        "spec": {
            "containers": [{"name": "trainer"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone]}
                }
            },
        }
    }
    pod = build_worker_pod(JobRef("j", "ns", "uid"), spec, 0, 1, template, avoid_nodes=["silent"])
    demand = PodDemand.from_pod_spec(pod["spec"])
    labels = {"zone": "z1"}
    assert placement_refusal(NodeInfo("silent", (), labels), demand) is not None
    assert placement_refusal(NodeInfo("healthy", (), labels), demand) is None
    assert placement_refusal(NodeInfo("elsewhere", (), {"zone": "z2"}), demand) is not None
    pinned = admitted_pod(pod, "healthy")
    assert pinned_node(pinned["spec"]) == "healthy"
    assert template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [zone]
    }  # the job's template is untouched
