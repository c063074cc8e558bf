"""The Node and Lease the agent registers and renews (pure)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

REAL_NODE_KEY = "phalanx.dev/real-node"
GPU_RESOURCE = "nvidia.com/gpu"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
AGENT_VERSION = "v1.36.0-phalanx.devnode"  # semver: some components parse it


@dataclass(frozen=True)
class NodeShape:
    name: str
    cpu: str
    memory: str
    pods: int = 32
    gpus: int = 0
    host_ip: str = "127.0.0.1"


def node_manifest(shape: NodeShape) -> dict[str, Any]:
    """Labelled and tainted so that only pods asking for a real node land here."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": shape.name,
            "labels": {
                "kubernetes.io/hostname": shape.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                REAL_NODE_KEY: "true",
            },
        },
        "spec": {"taints": [{"key": REAL_NODE_KEY, "value": "true", "effect": "NoSchedule"}]},
    }


def _micro_time(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_status(shape: NodeShape, now: float, ready_since: float) -> dict[str, Any]:
    capacity = {"cpu": shape.cpu, "memory": shape.memory, "pods": str(shape.pods)}
    if shape.gpus:
        capacity[GPU_RESOURCE] = str(shape.gpus)
    beat, since = _time(now), _time(ready_since)

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": beat,
            "lastTransitionTime": since,
        }

    return {
        "capacity": capacity,
        "allocatable": dict(capacity),
        "conditions": [
            condition("MemoryPressure", "False", "AgentHasSufficientMemory", "not measured by the dev node"),
            condition("DiskPressure", "False", "AgentHasNoDiskPressure", "not measured by the dev node"),
            condition("PIDPressure", "False", "AgentHasSufficientPID", "not measured by the dev node"),
            condition(
                "Ready", "True", "AgentReady", "phalanx dev node agent is running pods as local processes"
            ),
        ],
        "addresses": [
            {"type": "InternalIP", "address": shape.host_ip},
            {"type": "Hostname", "address": shape.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": platform.release(),
            "osImage": "phalanx dev node (local processes)",
            "containerRuntimeVersion": "local-process://0.1",
            "kubeletVersion": AGENT_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def lease_manifest(node_name: str, node_uid: str, now: float) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node_name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}],
        },
        "spec": {
            "holderIdentity": node_name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": _micro_time(now),
        },
    }


def real_node_placement() -> dict[str, Any]:
    """nodeSelector and toleration a pod spec needs to run on a dev node."""
    return {
        "nodeSelector": {REAL_NODE_KEY: "true"},
        "tolerations": [{"key": REAL_NODE_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    }
