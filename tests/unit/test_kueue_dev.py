"""Pure parts of the dev cluster's Kueue: its Configuration, webhook and CRD rewrites, its command line."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from phalanx.devcluster import components
from phalanx.devcluster.kueue import (
    MUTATING_WEBHOOK_CONFIG,
    VALIDATING_WEBHOOK_CONFIG,
    KueuePorts,
    KueueSettings,
    WaitForPodsReady,
    conversion_crd_names,
    crd_manifests,
    framework_resource,
    manager_configuration,
    webhook_configurations,
)

pytestmark = pytest.mark.unit

PORTS = KueuePorts(webhook=19443, metrics=19080, health=19081)
CA = b"-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"


def hook(name: str, group: str, resource: str, path: str) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "failurePolicy": "Fail",
        "rules": [
            {"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": [resource]}
        ],
        "sideEffects": "None",
    }


UPSTREAM = [
    {"kind": "MutatingWebhookConfiguration", "metadata": {"name": "mutating-webhook-configuration"}, "webhooks": [
        hook("mjob.kb.io", "batch", "jobs", "/mutate-batch-v1-job"),
        hook("mpod.kb.io", "", "pods", "/mutate--v1-pod"),
        hook("mdeployment.kb.io", "apps", "deployments", "/mutate-apps-v1-deployment"),
        hook("mrayjob.kb.io", "ray.io", "rayjobs", "/mutate-ray-io-v1-rayjob"),
        hook("mworkload.kb.io", "kueue.x-k8s.io", "workloads", "/mutate-kueue-x-k8s-io-v1beta2-workload"),
    ]},
    {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "validating-webhook-configuration"}, "webhooks": [
        hook("vjob.kb.io", "batch", "jobs", "/validate-batch-v1-job"),
        hook("vclusterqueue.kb.io", "kueue.x-k8s.io", "clusterqueues", "/validate-kueue-x-k8s-io-v1beta2-clusterqueue"),
    ]},
]  # fmt: skip


def test_framework_names_map_to_the_resources_their_webhooks_match() -> None:
    assert framework_resource("batch/job") == ("batch", "jobs")
    assert framework_resource("pod") == ("", "pods")
    assert framework_resource("statefulset") == ("apps", "statefulsets")
    assert framework_resource("jobset.x-k8s.io/jobset") == ("jobset.x-k8s.io", "jobsets")
    with pytest.raises(ValueError, match="'group/kind'"):
        framework_resource("job")


def test_settings_reject_a_framework_name_they_cannot_map() -> None:
    with pytest.raises(ValueError, match="Kueue framework 'jobs'"):
        KueueSettings(frameworks=("jobs",))


def test_configuration_binds_to_loopback_with_internal_certs_off() -> None:
    config = manager_configuration(KueueSettings(), PORTS, Path("/state/kueue/certs"))
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["webhook"] == {"host": "127.0.0.1", "port": 19443, "certDir": "/state/kueue/certs"}
    assert config["metrics"]["bindAddress"] == "127.0.0.1:19080"
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:19081"
    assert config["internalCertManagement"] == {"enable": False}
    assert config["leaderElection"] == {"leaderElect": False}
    # TrainingJob is an external framework, so Kueue's pod integration leaves its pods alone.
    assert config["integrations"] == {
        "frameworks": ["batch/job", "pod"],
        "externalFrameworks": ["TrainingJob.v1alpha1.phalanx.dev"],
    }
    assert "waitForPodsReady" not in config
    assert config["featureGates"] == {"VisibilityOnDemand": False}


def test_wait_for_pods_ready_and_external_frameworks_are_written_when_asked() -> None:
    settings = KueueSettings(
        external_frameworks=("TrainingJob.v1alpha1.phalanx.dev",),
        wait_for_pods_ready=WaitForPodsReady(
            timeout_seconds=90, block_admission=False, recovery_timeout_seconds=30
        ),
    )
    config = manager_configuration(settings, PORTS, Path("/c"))
    assert config["waitForPodsReady"] == {"timeout": "90s", "blockAdmission": False, "recoveryTimeout": "30s"}
    assert config["integrations"]["externalFrameworks"] == ["TrainingJob.v1alpha1.phalanx.dev"]


def test_wait_for_pods_ready_rejects_a_zero_timeout() -> None:
    with pytest.raises(ValueError, match="timeout_seconds must be >= 1"):
        WaitForPodsReady(timeout_seconds=0)


def test_webhooks_point_at_the_local_url_with_our_ca_and_only_for_enabled_frameworks() -> None:
    out = webhook_configurations(UPSTREAM, "https://127.0.0.1:19443", CA, ("batch/job", "pod"))
    mutating, validating = out
    assert mutating["metadata"]["name"] == MUTATING_WEBHOOK_CONFIG
    assert validating["metadata"]["name"] == VALIDATING_WEBHOOK_CONFIG
    assert [h["name"] for h in mutating["webhooks"]] == ["mjob.kb.io", "mpod.kb.io", "mworkload.kb.io"]
    assert [h["name"] for h in validating["webhooks"]] == ["vjob.kb.io", "vclusterqueue.kb.io"]
    job = mutating["webhooks"][0]
    assert job["clientConfig"] == {
        "url": "https://127.0.0.1:19443/mutate-batch-v1-job",
        "caBundle": base64.b64encode(CA).decode(),
    }
    assert job["failurePolicy"] == "Fail" and job["rules"] == UPSTREAM[0]["webhooks"][0]["rules"]


def test_pod_webhook_leaves_the_system_namespaces_alone() -> None:
    mutating = webhook_configurations(UPSTREAM, "https://x", CA, ("pod",))[0]
    pod = next(h for h in mutating["webhooks"] if h["name"] == "mpod.kb.io")
    (expr,) = pod["namespaceSelector"]["matchExpressions"]
    assert expr["operator"] == "NotIn" and set(expr["values"]) == {"kube-system", "kueue-system"}
    workload = next(h for h in mutating["webhooks"] if h["name"] == "mworkload.kb.io")
    assert "namespaceSelector" not in workload


def test_conversion_webhook_goes_to_the_crds_the_kustomization_patches() -> None:
    kustomization = {
        "resources": ["bases/a.yaml"],
        "patches": [{"path": "patches/webhook_in_workloads.yaml"}],
    }
    patches = {
        "patches/webhook_in_workloads.yaml": {
            "metadata": {"name": "workloads.kueue.x-k8s.io"},
            "spec": {"conversion": {"strategy": "Webhook"}},
        },
        # present in the module but commented out of the kustomization: not applied upstream either
        "patches/webhook_in_resourceflavors.yaml": {
            "metadata": {"name": "resourceflavors.kueue.x-k8s.io"},
            "spec": {"conversion": {"strategy": "Webhook"}},
        },
    }
    names = conversion_crd_names(kustomization, patches)
    assert names == {"workloads.kueue.x-k8s.io"}
    crds = [{"metadata": {"name": n}, "spec": {"group": "kueue.x-k8s.io"}} for n in
            ("workloads.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io")]  # fmt: skip
    workloads, flavors = crd_manifests(crds, names, "https://127.0.0.1:19443", CA)
    assert (
        workloads["spec"]["conversion"]["webhook"]["clientConfig"]["url"] == "https://127.0.0.1:19443/convert"
    )
    assert "conversion" not in flavors["spec"]


def test_manager_runs_in_a_private_mount_namespace_with_an_etc_overlay() -> None:
    component = components.kueue_manager(
        Path("/cache/kueue"),
        Path("/s/config.yaml"),
        Path("/s/kubeconfig"),
        Path("/s/up"),
        Path("/s/work"),
        as_root=False,
    )
    argv = component.argv
    assert argv[:4] == ("unshare", "--user", "--map-root-user", "--mount")
    assert "lowerdir=/etc,upperdir=$1,workdir=$2" in argv[argv.index("-c") + 1]
    binary = argv.index("/cache/kueue")
    assert argv[binary - 2 : binary] == ("/s/up", "/s/work")  # $1 and $2 of the shell line
    assert argv[binary + 1 : binary + 3] == ("--config=/s/config.yaml", "--kubeconfig=/s/kubeconfig")
    root = components.kueue_manager(
        Path("/k"), Path("/c"), Path("/kc"), Path("/u"), Path("/w"), as_root=True
    ).argv
    assert root[:2] == ("unshare", "--mount")


def test_manager_refuses_a_state_dir_overlayfs_cannot_name() -> None:
    with pytest.raises(ValueError, match="overlayfs options"):
        components.kueue_manager(
            Path("/k"), Path("/c"), Path("/kc"), Path("/a,b/up"), Path("/w"), as_root=True
        )


def test_dev_up_kueue_options_become_settings() -> None:
    from phalanx.cli import _kueue_settings, build_parser

    def settings(*argv: str) -> KueueSettings | None:
        return _kueue_settings(build_parser().parse_args(["dev", "up", *argv]))

    assert settings() is None
    assert settings("--kueue") == KueueSettings()
    assert settings("--kueue", "--kueue-wait-for-pods-ready", "120") == KueueSettings(
        wait_for_pods_ready=WaitForPodsReady(timeout_seconds=120)
    )
    with pytest.raises(SystemExit, match="needs --kueue"):
        settings("--kueue-wait-for-pods-ready", "120")
    with pytest.raises(SystemExit, match="--kueue-wait-for-pods-ready: .*timeout_seconds must be >= 1"):
        settings("--kueue", "--kueue-wait-for-pods-ready", "0")


KUEUE_BIN_SH = Path(__file__).resolve().parents[2] / "hack" / "kueue-bin.sh"


def run_kueue_bin(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(KUEUE_BIN_SH), *args], env={**os.environ, **env}, capture_output=True, text=True
    )


def test_kueue_bin_prints_its_version_keyed_cache_dir(tmp_path: Path) -> None:
    out = run_kueue_bin({"PHALANX_CACHE": str(tmp_path)}, "--print-dir")
    assert out.returncode == 0 and out.stdout.strip() == str(tmp_path / "kueue-v0.17.0")


def test_kueue_bin_names_the_missing_piece_of_a_given_dir(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kueue").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "kueue").chmod(0o755)
    out = run_kueue_bin({"PHALANX_KUEUE_DIR": str(tmp_path)})
    assert out.returncode == 1 and "lacks crd/bases/*.yaml" in out.stderr
    (tmp_path / "crd" / "bases").mkdir(parents=True)
    (tmp_path / "crd" / "bases" / "a.yaml").write_text("{}\n")
    (tmp_path / "crd" / "kustomization.yaml").write_text("resources: []\n")
    (tmp_path / "webhook").mkdir()
    (tmp_path / "webhook" / "manifests.yaml").write_text("{}\n")
    out = run_kueue_bin({"PHALANX_KUEUE_DIR": str(tmp_path)})
    assert out.returncode == 0 and out.stdout.strip() == str(tmp_path)
