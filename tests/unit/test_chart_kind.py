"""The kind path (kind/cluster.yaml, hack/kind-up.sh) for users with Docker.

No Docker engine here: the config is checked for shape and the script for syntax and for the
commands it would run (--dry-run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
KIND_UP = REPO_ROOT / "hack" / "kind-up.sh"


def test_kind_config_has_one_control_plane_and_two_workers() -> None:
    config = yaml.safe_load((REPO_ROOT / "kind" / "cluster.yaml").read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [node["role"] for node in config["nodes"]]
    assert roles == ["control-plane", "worker", "worker"]
    for node in config["nodes"]:
        assert set(node) <= {
            "role",
            "labels",
            "image",
            "extraMounts",
            "extraPortMappings",
            "kubeadmConfigPatches",
        }


def test_kind_up_script_parses() -> None:
    result = subprocess.run(["bash", "-n", str(KIND_UP)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_kind_up_dry_run_creates_builds_loads_installs_and_submits() -> None:
    result = subprocess.run(
        ["bash", str(KIND_UP), "--dry-run", "examples/quickstart.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "HELM": "helm", "PHALANX_IMAGE_TAG": "t1"},
    )
    assert result.returncode == 0, result.stderr
    commands = result.stdout.splitlines()
    expected_prefixes = [
        "kind create cluster --name phalanx --config kind/cluster.yaml",
        "docker build --tag phalanx-operator:t1 --file Dockerfile .",
        "docker build --tag phalanx-trainer:t1 --file trainer-image/Dockerfile trainer-image",
        "kind load docker-image --name phalanx phalanx-operator:t1 phalanx-trainer:t1",
        "helm upgrade --install phalanx charts/phalanx",
        "sed 's#image: .*phalanx-trainer.*#image: phalanx-trainer:t1#' examples/quickstart.yaml",
    ]
    assert len(commands) == len(expected_prefixes), commands
    for command, prefix in zip(commands, expected_prefixes, strict=True):
        assert command.startswith(prefix), f"{command!r} should start with {prefix!r}"
    assert "image.pullPolicy=Never" in commands[4] and "image.tag=t1" in commands[4]


FAKE_DOCKER = """#!/bin/bash
# Answers `docker info` so kind gets past provider detection; everything after fails.
if [[ "$1" == "info" ]]; then
  echo '{"CgroupDriver":"systemd","CgroupVersion":"2","OSType":"linux"}'; exit 0
fi
exit 1
"""


def test_kind_itself_accepts_the_config(tmp_path: Path) -> None:
    kind = shutil.which("kind") or os.environ.get("PHALANX_KIND")
    if not kind:
        pytest.skip("kind is not installed (go install sigs.k8s.io/kind@v0.33.0 to run this check)")
    # No Docker engine: kind decodes the config strictly (unknown fields fail) before it lists nodes,
    # so failing at `docker ps` means the config was accepted.
    (tmp_path / "docker").write_text(FAKE_DOCKER)
    (tmp_path / "docker").chmod(0o755)
    result = subprocess.run(
        [
            kind,
            "create",
            "cluster",
            "--name",
            "cfgcheck",
            "--config",
            str(REPO_ROOT / "kind" / "cluster.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )
    assert "unable to decode config" not in result.stderr, result.stderr
    assert "docker ps" in result.stderr, result.stderr
