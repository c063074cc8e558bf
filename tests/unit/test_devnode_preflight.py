"""The dev node's resolver preflight: a missing or broken nss_wrapper stops it with the fix named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from phalanx.devcluster import realnode
from phalanx.devcluster.cluster import ClusterError, LocalCluster
from phalanx.devnode.network import resolver_env
from phalanx.devnode.preflight import PreflightError, check_name_resolution, probe_environment

pytestmark = pytest.mark.unit


def test_a_missing_library_is_named_with_the_command_that_installs_it(tmp_path: Path) -> None:
    missing = tmp_path / "libnss_wrapper.so"
    with pytest.raises(PreflightError) as raised:
        check_name_resolution(str(missing), sys.executable)
    message = str(raised.value)
    assert str(missing) in message and "is missing" in message
    assert "apt-get install -y libnss-wrapper" in message
    assert "\n" not in message


def test_a_library_that_does_not_resolve_names_is_refused(tmp_path: Path) -> None:
    """Not a shared object: the loader only warns, and the probe's name stays unresolved."""
    broken = tmp_path / "libnss_wrapper.so"
    broken.write_text("not a shared object\n")
    with pytest.raises(PreflightError, match="does not resolve"):
        check_name_resolution(str(broken), sys.executable)


def test_the_probe_sets_up_the_resolver_as_pods_get_it(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    env = probe_environment("/lib/nss.so", hosts)
    assert env["LD_PRELOAD"] == "/lib/nss.so"
    assert {k: v for k, v in env.items() if k.startswith("NSS_WRAPPER_") and k != "NSS_WRAPPER_HOSTNAME"} == {
        k: v for k, v in resolver_env(hosts, "pod-0").items() if k != "NSS_WRAPPER_HOSTNAME"
    }


def test_dev_up_with_real_nodes_stops_before_the_control_plane_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(realnode, "default_nss_wrapper", lambda: str(tmp_path / "absent.so"))
    cluster = LocalCluster(tmp_path / "state", log=lambda msg: None)
    with pytest.raises(ClusterError, match="absent.so is missing"):
        cluster.up(pools=(), real_nodes=1)
    assert not (tmp_path / "state" / "run").exists()  # nothing was started
