"""Simulated node manifests (pure): kwok keeps these Ready and 'runs' the pods bound to them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class NodePool:
    """A group of identical simulated nodes."""

    name_prefix: str = "gpu-node"
    count: int = 4
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    gpus: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    # MIG devices as the NVIDIA device plugin's mixed strategy names them: profile -> count.
    mig: Mapping[str, int] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    # (key, value, effect) triples.
    taints: Sequence[tuple[str, str, str]] = ()
    zones: int = 2  # spread nodes over this many zones, round-robin; racks: two nodes per rack
    # The first N nodes carry a kubernetes.io/hostname label that differs from their name, as with
    # kubelet --hostname-override and on some clouds: nothing may take one for the other.
    renamed_hostnames: int = 0

    def __post_init__(self) -> None:
        if self.count < 0 or self.gpus < 0 or self.pods < 1:
            raise ValueError(f"node pool {self.name_prefix!r}: count and gpus must be >= 0, pods >= 1")
        if self.renamed_hostnames < 0:
            raise ValueError(f"node pool {self.name_prefix!r}: renamed_hostnames must be >= 0")


def hostname_label(pool: NodePool, index: int) -> str:
    """The node's kubernetes.io/hostname label: its name, or for renamed nodes another value."""
    name = f"{pool.name_prefix}-{index}"
    return f"{name}-host" if index < pool.renamed_hostnames else name


def node_manifest(pool: NodePool, index: int) -> dict[str, Any]:
    name = f"{pool.name_prefix}-{index}"
    capacity: dict[str, str] = {"cpu": pool.cpu, "memory": pool.memory, "pods": str(pool.pods)}
    labels = {
        HOSTNAME_LABEL: hostname_label(pool, index),
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        "topology.kubernetes.io/zone": f"zone-{index % max(pool.zones, 1)}",
        "topology.phalanx.dev/rack": f"rack-{index // 2}",
    }
    if pool.gpus:
        capacity[GPU_RESOURCE] = str(pool.gpus)
        labels["nvidia.com/gpu.product"] = pool.gpu_product
        labels["nvidia.com/gpu.count"] = str(pool.gpus)
    if pool.mig:
        labels["nvidia.com/mig.strategy"] = "mixed"
        for profile, count in pool.mig.items():
            capacity[f"nvidia.com/mig-{profile}"] = str(count)
    labels.update(pool.labels)
    spec: dict[str, Any] = {}
    if pool.taints:
        spec["taints"] = [{"key": k, "value": v, "effect": e} for k, v, e in pool.taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_NODE_ANNOTATION: "fake"}},
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def without_capacity(
    nodes: Sequence[Mapping[str, Any]], manifests: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The manifests of nodes whose allocatable lacks what the manifest gave them. kwok's first status
    write can land after ours and drop it: a 1,000-node bench lost one node's capacity (no GPUs
    there, 4 of 4,000 jobs never admitted)."""
    allocatable = {n["metadata"]["name"]: (n.get("status") or {}).get("allocatable") or {} for n in nodes}
    return [
        m
        for m in manifests
        if any(
            allocatable.get(m["metadata"]["name"], {}).get(k) != v
            for k, v in m["status"]["allocatable"].items()
        )
    ]


def node_manifests(pools: Sequence[NodePool]) -> list[dict[str, Any]]:
    return [node_manifest(pool, i) for pool in pools for i in range(pool.count)]


DEFAULT_POOLS: tuple[NodePool, ...] = (
    NodePool(name_prefix="gpu-node", count=4, gpus=8, renamed_hostnames=2),
    NodePool(
        name_prefix="mig-node",
        count=1,
        gpus=0,
        gpu_product="NVIDIA-A100-SXM4-80GB",
        mig={"1g.10gb": 7, "3g.40gb": 2},
        labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        renamed_hostnames=1,
    ),
    NodePool(name_prefix="cpu-node", count=2, gpus=0, cpu="32", memory="128Gi"),
)


def pools_from_config(raw: Sequence[Mapping[str, Any]]) -> list[NodePool]:
    """Reads node pools from a YAML list (`phalanx dev up --nodes FILE`)."""
    pools = []
    for item in raw:
        known = set(NodePool.__dataclass_fields__)
        unknown = set(item) - known
        if unknown:
            raise ValueError(f"node pool: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        values = dict(item)
        if "taints" in values:
            values["taints"] = tuple(
                (t["key"], t.get("value", ""), t.get("effect", "NoSchedule")) for t in values["taints"]
            )
        pools.append(NodePool(**values))
    return pools
