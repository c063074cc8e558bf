"""Pure parts of the local cluster: node manifests, node pool config, component command lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phalanx.devcluster import components
from phalanx.devcluster.nodes import (
    DEFAULT_POOLS,
    NodePool,
    node_manifest,
    node_manifests,
    pools_from_config,
    without_capacity,
)
from phalanx.devcluster.pki import Pki

pytestmark = pytest.mark.unit


def test_gpu_node_has_capacity_labels_and_kwok_annotation() -> None:
    node = node_manifest(NodePool(name_prefix="n", gpus=8, zones=2), 3)
    assert node["metadata"]["name"] == "n-3"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "zone-1"
    assert node["metadata"]["labels"]["topology.phalanx.dev/rack"] == "rack-1"


def test_mig_node_uses_mixed_strategy_resource_names() -> None:
    node = node_manifest(NodePool(name_prefix="m", gpus=0, mig={"1g.10gb": 7}), 0)
    assert node["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "7"
    assert "nvidia.com/gpu" not in node["status"]["capacity"]
    assert node["metadata"]["labels"]["nvidia.com/mig.strategy"] == "mixed"


def test_taints_are_rendered() -> None:
    node = node_manifest(NodePool(taints=(("gpu", "reserved", "NoSchedule"),)), 0)
    assert node["spec"]["taints"] == [{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}]


def test_default_pools_include_gpu_mig_and_cpu_nodes() -> None:
    names = [n["metadata"]["name"] for n in node_manifests(DEFAULT_POOLS)]
    assert "gpu-node-0" in names and "mig-node-0" in names and "cpu-node-0" in names
    assert len(names) == len(set(names))


def test_renamed_nodes_carry_a_hostname_label_that_differs_from_their_name() -> None:
    pool = NodePool(name_prefix="r", count=3, renamed_hostnames=2)
    labels = {
        n["metadata"]["name"]: n["metadata"]["labels"]["kubernetes.io/hostname"]
        for n in node_manifests([pool])
    }
    assert labels == {"r-0": "r-0-host", "r-1": "r-1-host", "r-2": "r-2"}
    # The default cluster has some of them, so every test that pins pods meets one.
    defaults = [n["metadata"] for n in node_manifests(DEFAULT_POOLS)]
    assert any(
        m["labels"]["kubernetes.io/hostname"] != m["name"] for m in defaults if m["name"].startswith("gpu")
    )
    assert any(
        m["labels"]["kubernetes.io/hostname"] != m["name"] for m in defaults if m["name"].startswith("mig")
    )


def test_pool_config_rejects_unknown_fields_by_name() -> None:
    with pytest.raises(ValueError, match="gpu_count"):
        pools_from_config([{"count": 1, "gpu_count": 8}])
    (pool,) = pools_from_config([{"count": 2, "gpus": 4, "taints": [{"key": "k", "value": "v"}]}])
    assert pool.taints == (("k", "v", "NoSchedule"),)


def test_negative_pool_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="count"):
        NodePool(count=-1)


def test_apiserver_command_enables_rbac_priority_and_service_account_signing() -> None:
    pki = Pki(Path("/pki"))
    ports = components.Ports(1, 2, 3, 4, 5, 6)
    argv = components.kube_apiserver(Path("/bin"), pki, ports).argv
    assert "--authorization-mode=RBAC" in argv
    plugins = next(a for a in argv if a.startswith("--enable-admission-plugins=")).split("=", 1)[1].split(",")
    assert {"Priority", "OwnerReferencesPermissionEnforcement"} <= set(plugins)
    assert "--service-account-signing-key-file=/pki/sa.key" in argv
    assert "--etcd-servers=http://127.0.0.1:1" in argv
    assert "--bind-address=127.0.0.1" in argv


def test_controller_manager_runs_every_default_controller() -> None:
    argv = components.kube_controller_manager(
        Path("/bin"), Path("/kc"), Pki(Path("/pki")), components.Ports(1, 2, 3, 4, 5, 6)
    ).argv
    assert "--controllers=*" in argv
    assert "--leader-elect=false" in argv


def test_missing_binaries_give_one_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx.devcluster.cluster import ClusterError, LocalCluster

    (tmp_path / "etcd").write_text("#!/bin/sh\n")
    monkeypatch.setenv("PHALANX_CLUSTER_BIN", str(tmp_path))
    with pytest.raises(ClusterError, match="missing cluster binaries.*kube-apiserver.*make cluster-bin"):
        LocalCluster(tmp_path / "state").up()


def test_a_component_that_dies_at_start_is_reported_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from phalanx.devcluster.cluster import REQUIRED_BINARIES, ClusterError, LocalCluster

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in REQUIRED_BINARIES:
        script = bin_dir / name
        script.write_text(
            "#!/bin/sh\necho 'listen tcp 127.0.0.1: bind: address already in use' >&2\nexit 1\n"
        )
        script.chmod(0o755)
    monkeypatch.setenv("PHALANX_CLUSTER_BIN", str(bin_dir))
    cluster = LocalCluster(tmp_path / "state", log=lambda _: None)
    with pytest.raises(ClusterError, match="etcd exited during start-up(.|\n)*address already in use"):
        cluster.up(timeout=20)
    assert cluster.running_components() == {}


def test_a_crd_without_conditions_yet_is_not_established() -> None:
    from phalanx.devcluster.crds import established

    assert not established({"status": {}})
    assert not established({"status": {"conditions": [{"type": "Established", "status": "False"}]}})
    assert established({"status": {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                                  {"type": "Established", "status": "True"}]}})  # fmt: skip


def test_nodes_whose_capacity_was_lost_are_found_to_be_written_again() -> None:
    manifests = node_manifests([NodePool(name_prefix="n", count=3, gpus=8)])
    listed = [
        {"metadata": {"name": "n-0"}, "status": {"allocatable": dict(manifests[0]["status"]["allocatable"])}},
        {"metadata": {"name": "n-1"}, "status": {"conditions": []}},  # kwok's first write dropped it
        {"metadata": {"name": "n-2"}, "status": {"allocatable": {"cpu": "1"}}},
    ]
    assert [m["metadata"]["name"] for m in without_capacity(listed, manifests)] == ["n-1", "n-2"]
    assert without_capacity(listed[:1], manifests[:1]) == []


def test_a_port_taken_before_its_component_binds_it_starts_the_control_plane_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A free port is free only until someone binds it: another worker's cluster or a test's rendezvous
    # took one in a CI run (kube-controller-manager: bind: address already in use), and every test of
    # that worker errored. The control plane starts again on fresh ports; any other failure is raised.
    from phalanx.devcluster import cluster as cluster_module
    from phalanx.devcluster.cluster import PORT_ATTEMPTS, ClusterError, LocalCluster

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in cluster_module.REQUIRED_BINARIES:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PHALANX_CLUSTER_BIN", str(bin_dir))
    starts: list[int] = []

    def start(failures: int, error: str) -> Any:
        def control_plane(self: LocalCluster, *_: Any) -> None:
            starts.append(1)
            if len(starts) <= failures:
                raise ClusterError(
                    f"kube-controller-manager exited during start-up; last log lines:\n{error}"
                )

        return control_plane

    for name in ("add_nodes", "_wait_nodes_ready", "_wait_default_service_account"):
        monkeypatch.setattr(LocalCluster, name, lambda *_, **__: None)
    taken = (
        'err="failed to listen on 127.0.0.1:24000: listen tcp 127.0.0.1:24000: bind: address already in use"'
    )
    monkeypatch.setattr(LocalCluster, "_start_control_plane", start(1, taken))
    LocalCluster(tmp_path / "a", log=lambda _: None).up()
    assert len(starts) == 2

    starts.clear()
    monkeypatch.setattr(LocalCluster, "_start_control_plane", start(PORT_ATTEMPTS, taken))
    with pytest.raises(ClusterError, match="address already in use"):
        LocalCluster(tmp_path / "b", log=lambda _: None).up()
    assert len(starts) == PORT_ATTEMPTS

    starts.clear()
    monkeypatch.setattr(LocalCluster, "_start_control_plane", start(1, "flag provided but not defined"))
    with pytest.raises(ClusterError, match="flag provided"):
        LocalCluster(tmp_path / "c", log=lambda _: None).up()
    assert len(starts) == 1
