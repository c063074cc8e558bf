"""Pod status, volumes and node objects of the dev node, as a kubelet would write them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phalanx.devnode.containers import ContainerConfigError
from phalanx.devnode.node import NodeShape, lease_manifest, node_manifest, node_status
from phalanx.devnode.podstatus import ContainerState, exit_code_of, orphan_status, pod_phase, pod_status
from phalanx.devnode.volumes import materialize, plan_volumes

pytestmark = pytest.mark.unit


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def test_running_containers_make_a_ready_running_pod() -> None:
    status = pod_status(
        [ContainerState("trainer", "img", started_at=100.0)], "127.9.9.2", "127.0.0.1", 99.0, 101.0
    )
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.9.9.2"
    assert conditions(status) == {"PodScheduled": "True", "Initialized": "True", "ContainersReady": "True",
                                  "Ready": "True"}  # fmt: skip
    assert status["containerStatuses"][0]["state"] == {"running": {"startedAt": "1970-01-01T00:01:40Z"}}


@pytest.mark.parametrize(
    ("codes", "phase"), [((0, 0), "Succeeded"), ((0, 3), "Failed"), ((75,), "Failed"), ((None, 0), "Running")]
)
def test_phase_follows_exit_codes_with_restart_policy_never(
    codes: tuple[int | None, ...], phase: str
) -> None:
    states = [
        ContainerState(f"c{i}", "img", 1.0, 2.0 if c is not None else None, c) for i, c in enumerate(codes)
    ]
    assert pod_phase(states) == phase


def test_a_terminated_container_reports_code_reason_and_times() -> None:
    status = pod_status(
        [ContainerState("trainer", "img", 100.0, 160.0, 143)], "127.9.9.2", "127.0.0.1", 99.0, 161.0
    )
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated == {
        "exitCode": 143,
        "reason": "Error",
        "startedAt": "1970-01-01T00:01:40Z",
        "finishedAt": "1970-01-01T00:02:40Z",
    }
    assert conditions(status)["Ready"] == "False"


def test_signals_become_128_plus_the_signal_number() -> None:
    assert (exit_code_of(-9), exit_code_of(-15), exit_code_of(3)) == (137, 143, 3)


def test_a_pod_left_by_an_earlier_agent_run_is_failed_with_the_reason() -> None:
    pod = {"spec": {"containers": [{"name": "trainer", "image": "img"}]}}
    status = orphan_status(pod, 200.0)
    assert (status["phase"], status["reason"]) == ("Failed", "NodeAgentRestarted")
    assert status["containerStatuses"][0]["state"]["terminated"]["reason"] == "NodeAgentRestarted"


def test_volumes_become_local_directories(tmp_path: Path) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "host", "hostPath": {"path": str(tmp_path / "host")}},
                {"name": "claim", "persistentVolumeClaim": {"claimName": "ckpt"}},
                {"name": "cfg", "configMap": {"name": "settings", "items": [{"key": "a", "path": "dir/a.yaml"}]}},
                {"name": "info", "downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]
        },
    }  # fmt: skip
    plans = plan_volumes(pod, tmp_path / "pod", tmp_path / "claims", lambda ns, name: {"a": f"{ns}/{name}"})
    dirs = materialize(plans)
    assert dirs["scratch"] == str(tmp_path / "pod" / "volumes" / "scratch")
    assert dirs["host"] == str(tmp_path / "host")
    assert dirs["claim"] == str(tmp_path / "claims" / "ns" / "ckpt")  # outlives the pod, as a claim does
    assert Path(dirs["cfg"], "dir", "a.yaml").read_text() == "ns/settings"
    assert Path(dirs["info"], "ns").read_text() == "ns"
    assert all(Path(d).is_dir() for d in dirs.values())


def test_an_unsupported_volume_kind_is_named(tmp_path: Path) -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"volumes": [{"name": "v", "nfs": {}}]}}
    with pytest.raises(ContainerConfigError, match="nfs"):
        plan_volumes(pod, tmp_path, tmp_path, lambda ns, name: {})


def test_the_node_is_tainted_labelled_and_reports_ready_with_its_capacity() -> None:
    shape = NodeShape("real-0", cpu="2", memory="8Gi", pods=16, gpus=1)
    manifest = node_manifest(shape)
    assert manifest["metadata"]["labels"]["phalanx.dev/real-node"] == "true"
    assert manifest["spec"]["taints"] == [
        {"key": "phalanx.dev/real-node", "value": "true", "effect": "NoSchedule"}
    ]
    status = node_status(shape, now=10.0, ready_since=5.0)
    assert status["capacity"] == {"cpu": "2", "memory": "8Gi", "pods": "16", "nvidia.com/gpu": "1"}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["lastHeartbeatTime"]) == ("True", "1970-01-01T00:00:10Z")
    lease = lease_manifest("real-0", "node-uid", 10.5)
    assert lease["spec"]["renewTime"] == "1970-01-01T00:00:10.500000Z"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
