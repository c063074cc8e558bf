"""`helm install` of charts/phalanx into the local control plane: CRD, RBAC, and what the operator's
service account may and may not do (`kubectl auth can-i --as=system:serviceaccount:...`).

The operator image is not pullable here. In the integration tests kwok's simulated nodes report the
pod Running anyway; the e2e test places it on the dev node, which runs `phalanx operator` from this
checkout as a local process, and has it reconcile a TrainingJob to Succeeded.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Cluster, OperatorProcess, RealNode, wait_for
from tests.jobs import training_job

CHART = Path(__file__).resolve().parents[2] / "charts" / "phalanx"

# (verb, resource, extra kubectl arguments) the operator needs in a namespace it watches.
NEEDED_IN_WATCHED_NAMESPACE = (
    ("watch", "trainingjobs.phalanx.dev", ()),
    ("delete", "trainingjobs.phalanx.dev", ()),
    ("patch", "trainingjobs.phalanx.dev", ("--subresource=status",)),
    # blockOwnerDeletion on the pods' and Service's ownerReference (OwnerReferencesPermissionEnforcement).
    ("update", "trainingjobs.phalanx.dev", ("--subresource=finalizers",)),
    ("create", "pods", ()),
    ("delete", "pods", ()),
    ("create", "pods", ("--subresource=eviction",)),  # preemption goes through the Eviction API
    ("create", "services", ()),
    ("create", "events", ()),
    ("create", "podgroups.scheduling.volcano.sh", ()),
    ("get", "podgroups.scheduling.x-k8s.io", ()),
    # The Workloads of deleted jobs are found by label; Kueue's finalizer comes off with a patch.
    ("list", "workloads.kueue.x-k8s.io", ()),
    ("patch", "workloads.kueue.x-k8s.io", ()),
    ("watch", "workloads.kueue.x-k8s.io", ()),
)
# Groups whose API the test cluster does not serve: `kubectl auth can-i` cannot resolve them (it
# falls back to group "*"), so these are asked through a SubjectAccessReview with the group spelt out.
APIS_NOT_SERVED = ("scheduling.volcano.sh", "scheduling.x-k8s.io", "kueue.x-k8s.io")
NEEDED_CLUSTER_WIDE = (
    ("list", "nodes", ()),
    ("list", "priorityclasses.scheduling.k8s.io", ()),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io", ()),
    ("list", "pods", ()),  # gang admission counts every pod on a node
)
FORBIDDEN = (
    ("get", "secrets", ()),
    ("list", "secrets", ()),
    ("create", "pods", ("--subresource=exec",)),
    ("create", "pods", ("--subresource=attach",)),
    ("delete", "nodes", ()),
    ("create", "deployments.apps", ()),
    ("update", "configmaps", ()),
    ("create", "trainingjobs.phalanx.dev", ()),
    # Granted once, never called (tests/unit/test_rbac_matches_calls.py keeps the chart exact).
    ("patch", "trainingjobs.phalanx.dev", ()),
    ("update", "trainingjobs.phalanx.dev", ()),
    ("delete", "services", ()),
    ("create", "events.events.k8s.io", ()),
    ("create", "clusterroles.rbac.authorization.k8s.io", ()),
)


class Release:
    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        self.fullname = f"{name}-phalanx"
        self.service_account = f"system:serviceaccount:{namespace}:{self.fullname}"

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.cluster.bin_dir / "helm"), f"--kubeconfig={self.cluster.kubeconfig}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def can_i(self, verb: str, resource: str, *extra: str, namespace: str | None = None) -> bool:
        plural, _, group = resource.partition(".")
        if group in APIS_NOT_SERVED:
            return self.access_review(verb, plural, group, namespace)
        scope = ["--all-namespaces"] if namespace is None else ["-n", namespace]
        result = self.cluster.kubectl(
            "auth", "can-i", verb, resource, *extra, f"--as={self.service_account}", *scope, check=False
        )
        answer = result.stdout.strip()
        assert answer in ("yes", "no"), (
            f"kubectl auth can-i {verb} {resource}: {result.stdout}{result.stderr}"
        )
        return answer == "yes"

    def access_review(self, verb: str, resource: str, group: str, namespace: str | None) -> bool:
        attributes = {"verb": verb, "resource": resource, "group": group}
        if namespace is not None:
            attributes["namespace"] = namespace
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": self.service_account,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{self.namespace}",
                    "system:authenticated",
                ],
                "resourceAttributes": attributes,
            },
        }
        result = self.cluster.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
        return bool(json.loads(result.stdout)["status"].get("allowed"))


Installer = Callable[..., Release]


@pytest.fixture
def install(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Installer]:
    releases: list[Release] = []

    def _install(*set_values: str, values: dict[str, Any] | None = None) -> Release:
        release = Release(cluster, namespace, f"r{uuid.uuid4().hex[:6]}")
        args = [arg for value in set_values for arg in ("--set", value)]
        if values:
            values_file = tmp_path / f"{release.name}-values.yaml"
            values_file.write_text(yaml.safe_dump(values))
            args += ["--values", str(values_file)]
        result = release.helm(
            "install", release.name, str(CHART), "--namespace", namespace, "--set", "image.tag=test", *args
        )
        assert result.returncode == 0, f"helm install failed:\n{result.stdout}\n{result.stderr}"
        releases.append(release)
        return release

    yield _install
    for release in releases:
        release.helm("uninstall", release.name, "--namespace", namespace, "--wait=false")


@pytest.mark.integration
def test_cluster_wide_install_creates_crd_and_least_privilege_rbac(
    cluster: Cluster, install: Installer
) -> None:
    release = install()
    ns = release.namespace

    crd = cluster.get_json("crd", "trainingjobs.phalanx.dev")
    assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    cluster.get_json("serviceaccount", release.fullname, "-n", ns)
    role = cluster.get_json("clusterrole", release.fullname)
    binding = cluster.get_json("clusterrolebinding", release.fullname)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": release.fullname, "namespace": ns}]
    cluster.get_json("service", f"{release.fullname}-metrics", "-n", ns)

    for verb, resource, extra in NEEDED_IN_WATCHED_NAMESPACE + NEEDED_CLUSTER_WIDE:
        assert release.can_i(verb, resource, *extra), f"operator cannot {verb} {resource} {extra}"
    for verb, resource, extra in FORBIDDEN:
        assert not release.can_i(verb, resource, *extra), f"operator may {verb} {resource} {extra}"
        assert not release.can_i(verb, resource, *extra, namespace=ns), (
            f"operator may {verb} {resource} in {ns}"
        )

    # kwok's nodes pretend to run whatever is scheduled: the pod was admitted under `restricted` and placed.
    def operator_pod_running() -> bool:
        pods = cluster.get_json("pods", "-n", ns, "-l", f"app.kubernetes.io/instance={release.name}")["items"]
        return len(pods) == 1 and pods[0]["status"].get("phase") == "Running"

    wait_for(operator_pod_running, timeout=45, what="operator pod scheduled and Running on a kwok node")


@pytest.mark.integration
def test_namespaced_install_confines_the_operator_to_its_namespaces(
    cluster: Cluster, namespace: str, install: Installer
) -> None:
    release = install(f"watchNamespaces[0]={namespace}", "networkPolicy.enabled=true")

    cluster.get_json("role", release.fullname, "-n", namespace)
    # The API server took the job pods' policy as rendered (port ranges around the control port).
    policy = cluster.get_json("networkpolicy", f"{release.fullname}-job-pods", "-n", namespace)
    assert [rule.get("ports") for rule in policy["spec"]["ingress"]][-1] == [
        {"protocol": "TCP", "port": 9399}
    ]
    cluster.get_json("rolebinding", release.fullname, "-n", namespace)
    for verb, resource, extra in NEEDED_IN_WATCHED_NAMESPACE:
        assert release.can_i(verb, resource, *extra, namespace=namespace), f"cannot {verb} {resource}"
        assert not release.can_i(verb, resource, *extra, namespace="default"), (
            f"may {verb} {resource} in default"
        )
    for verb, resource, extra in NEEDED_CLUSTER_WIDE:
        assert release.can_i(verb, resource, *extra), f"cannot {verb} {resource}"
    assert not release.can_i("delete", "pods", namespace="default")
    assert not release.can_i("get", "secrets", namespace=namespace)


def service_account_kubeconfig(cluster: Cluster, namespace: str, service_account: str, path: Path) -> None:
    """A kubeconfig that authenticates as the service account (a TokenRequest token), nothing more."""
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    token = cluster.kubectl(
        "create", "token", service_account, "-n", namespace, "--duration=1h"
    ).stdout.strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": admin["clusters"][0]["cluster"]}],
                "users": [{"name": service_account, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "test", "user": service_account}}],
                "current-context": "sa",
            }
        )
    )
    path.chmod(0o600)


def scrape_metrics(address: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.e2e
def test_chart_operator_on_the_dev_node_reconciles_a_job_to_succeeded(
    cluster: Cluster,
    namespace: str,
    real_node: RealNode,
    operator_process: OperatorProcess,
    install: Installer,
) -> None:
    # Only the chart's operator may touch this job; the `operator` fixture restarts the shared one later.
    operator_process.stop()
    service_account = "phalanx-e2e"
    cluster.kubectl("create", "serviceaccount", service_account, "-n", namespace)
    # The dev node mounts no service-account token, so the operator gets its service account's token
    # through KUBECONFIG: it runs with exactly the chart's RBAC.  Outside /tmp, which the pod mounts.
    kubeconfig = Path.home() / ".cache" / "phalanx" / "e2e" / f"{namespace}.kubeconfig"
    service_account_kubeconfig(cluster, namespace, service_account, kubeconfig)
    values = {
        "serviceAccount": {"create": False, "name": service_account},
        "watchNamespaces": [namespace],
        "operator": {"extraEnv": [{"name": "KUBECONFIG", "value": str(kubeconfig)}]},
        "grafana": {"dashboard": {"enabled": False}},
        **real_node.placement(),
    }
    try:
        release = install(values=values)

        def operator_address() -> str | None:
            pods = cluster.get_json(
                "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={release.name}"
            )
            running = [
                p for p in pods["items"] if p["status"].get("phase") == "Running" and p["status"].get("podIP")
            ]
            return f"{running[0]['status']['podIP']}" if running else None

        pod_ip = wait_for(
            operator_address, timeout=60, what="the chart's operator pod Running on the dev node"
        )
        wait_for(
            lambda: _answers(f"http://{pod_ip}:8081/healthz"),
            timeout=60,
            what="the operator pod's /healthz",
        )

        job = training_job("helm-e2e", replicas=2, gpus=1, run_for="3s")
        cluster.apply(job, namespace=namespace)
        wait_for(
            lambda: (
                cluster.get_json("trainingjob", "helm-e2e", "-n", namespace).get("status", {}).get("phase")
                == "Succeeded"
            ),
            timeout=120,
            what="TrainingJob helm-e2e Succeeded",
        )
        samples = scrape_metrics(f"{pod_ip}:8080")
        job_labels = frozenset(
            {("namespace", namespace), ("trainingjob", "helm-e2e"), ("phase", "Succeeded")}
        )
        assert samples.get(("phalanx_job_phase", job_labels)) == 1.0, (
            "the chart's operator did not record the job"
        )
        assert samples[("phalanx_jobs_finished_total", frozenset({("result", "succeeded")}))] >= 1
        assert samples[("phalanx_pods_created_total", frozenset())] >= 2
        # The chart's CRD is the operator's own: its start-up check read it from the API server.
        [(_, crd_labels)] = [key for key in samples if key[0] == "phalanx_crd_schema_info"]
        assert dict(crd_labels)["current"] == "true", dict(crd_labels)
    finally:
        kubeconfig.unlink(missing_ok=True)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
