"""charts/phalanx: lint, render for several value sets, validate against the Kubernetes schemas,
and check the security and RBAC promises the chart makes.

Needs only the helm binary from hack/cluster-bin.sh (no cluster).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest
import yaml

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "phalanx"
KUBE_VERSION = "1.36.3"
MONITORING_API_VERSIONS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
MONITORING_GROUP = "monitoring.coreos.com"
NAMESPACED_WATCH = ["team-a", "team-b"]

# name -> (values, extra helm arguments)
VALUE_SETS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "default": ({}, ()),
    "namespaced": ({"watchNamespaces": NAMESPACED_WATCH}, ()),
    "monitoring": (
        {
            "metrics": {
                "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
                "podMonitor": {"enabled": True},
                "prometheusRule": {"enabled": True},
            }
        },
        tuple(arg for api in MONITORING_API_VERSIONS for arg in ("--api-versions", api)),
    ),
    "network-policy": (
        {
            "watchNamespaces": NAMESPACED_WATCH,
            "networkPolicy": {
                "enabled": True,
                "metricsFrom": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
                ],
            },
        },
        (),
    ),
    "network-policy-isolated": (
        {"watchNamespaces": NAMESPACED_WATCH, "networkPolicy": {"enabled": True, "isolateControlPort": True}},
        (),
    ),
    "monitoring-without-api": (
        {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}},
        (),
    ),
}

HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)


def helm_binary() -> Path:
    bin_dir = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "cluster-bin.sh"), "--print-dir"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    helm = Path(bin_dir) / "helm"
    if not helm.is_file():
        pytest.fail(f"helm not found at {helm}: run `bash hack/cluster-bin.sh` (or set PHALANX_CLUSTER_BIN)")
    return helm


def helm(
    *args: str, values: dict[str, Any] | None = None, tmp: Path | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [str(helm_binary()), *args]
    if values:
        assert tmp is not None
        values_file = tmp / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        cmd += ["--values", str(values_file)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@cache
def rendered(value_set: str) -> tuple[dict[str, Any], ...]:
    values, extra = VALUE_SETS[value_set]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values_file:
        yaml.safe_dump(values, values_file)
        values_file.flush()
        result = subprocess.run(
            [
                str(helm_binary()),
                "template",
                "rel",
                str(CHART),
                "--namespace",
                "phalanx-system",
                "--kube-version",
                KUBE_VERSION,
                "--include-crds",
                "--values",
                values_file.name,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 0, f"helm template ({value_set}) failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def the_deployment(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (deployment,) = of_kind(docs, "Deployment")
    return deployment


def rbac_rules(docs: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc.get("rules", []):
                yield f"{doc['kind']}/{doc['metadata']['name']}", rule


def grants(docs: tuple[dict[str, Any], ...], group: str, resource: str, verb: str) -> bool:
    return any(
        (group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
        and (resource in rule.get("resources", []) or "*" in rule.get("resources", []))
        and (verb in rule.get("verbs", []) or "*" in rule.get("verbs", []))
        for _, rule in rbac_rules(docs)
    )


# A light structural schema for the Prometheus Operator kinds, which kubernetes-validate lacks.
_MONITORING_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object",
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": {"type": "object", "required": ["matchLabels"]},
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        "honorLabels": {"type": "boolean"},
                    },
                },
            },
        },
    },
    "PodMonitor": {
        "type": "object",
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {
            "selector": {"type": "object"},
            "namespaceSelector": {"type": "object"},
            "podMetricsEndpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {
                        "relabelings": {
                            "type": "array",
                            "items": {"type": "object", "required": ["sourceLabels", "targetLabel"]},
                        }
                    },
                },
            },
        },
    },
    "PrometheusRule": {
        "type": "object",
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "properties": {
                        "rules": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["alert", "expr", "labels", "annotations"],
                                "properties": {
                                    "alert": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]+$"},
                                    "expr": {"type": "string", "minLength": 1},
                                    "for": {"type": "string", "pattern": "^[0-9]+(s|m|h)$"},
                                    "labels": {
                                        "type": "object",
                                        "required": ["severity"],
                                        "properties": {"severity": {"enum": ["info", "warning", "critical"]}},
                                    },
                                    "annotations": {"type": "object", "required": ["summary"]},
                                },
                            },
                        }
                    },
                },
            }
        },
    },
}


def brackets_balance(expr: str) -> bool:
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in expr:
        if char in "([{":
            stack.append(char)
        elif char in closing:
            if not stack or stack.pop() != closing[char]:
                return False
    return not stack


def test_the_built_helm_renders_the_chart_for_the_clusters_version_without_flags(tmp_path: Path) -> None:
    """hack/cluster-bin.sh links helm with the local cluster's Kubernetes version (not helm's 1.20)."""
    result = helm("template", "t", str(CHART), "--show-only", "templates/deployment.yaml")
    assert result.returncode == 0, result.stderr
    capabilities = tmp_path / "capabilities"
    (capabilities / "templates").mkdir(parents=True)
    (capabilities / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    (capabilities / "templates" / "v.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: v}\ndata: {v: '{{ .Capabilities.KubeVersion.Minor }}'}\n"
    )
    rendered_version = helm("template", "c", str(capabilities))
    assert rendered_version.returncode == 0, rendered_version.stderr
    assert yaml.safe_load(rendered_version.stdout)["data"]["v"] == KUBE_VERSION.split(".")[1]


def test_helm_lint_is_clean_for_every_value_set(tmp_path: Path) -> None:
    # helm lint has no --api-versions: the monitoring objects are linted through `helm template` below.
    for name, (values, _) in VALUE_SETS.items():
        result = helm(
            "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, values=values, tmp=tmp_path
        )
        assert result.returncode == 0, f"helm lint ({name}):\n{result.stdout}\n{result.stderr}"
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rendered_objects_validate_against_kubernetes_schemas(value_set: str) -> None:
    docs = rendered(value_set)
    assert docs, "nothing rendered"
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"].startswith(MONITORING_GROUP + "/"):
            jsonschema.validate(doc["spec"], _MONITORING_SCHEMAS[doc["kind"]])
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{value_set}: {name} is invalid at {'.'.join(map(str, exc.path))}: {exc.message}")


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_templated_object_carries_the_helm_convention_labels(value_set: str) -> None:
    for doc in rendered(value_set):
        if doc["kind"] == "CustomResourceDefinition":
            continue  # crds/ is copied verbatim from the generator, not templated
        labels = doc["metadata"].get("labels", {})
        missing = [label for label in HELM_LABELS if label not in labels]
        assert not missing, f"{doc['kind']}/{doc['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_operator_pod_meets_pod_security_restricted() -> None:
    pod = the_deployment(rendered("default"))["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # No fixed UID (the image's USER is non-root), so a platform that assigns UIDs can run it.
    assert "runAsUser" not in pod["securityContext"] and "fsGroup" not in pod["securityContext"]
    assert all("runAsUser" not in container["securityContext"] for container in pod["containers"])
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_operator_runs_one_leader_elected_replica_with_probes_on_the_health_port() -> None:
    deployment = the_deployment(rendered("default"))
    assert deployment["spec"]["replicas"] == 1
    # Only the Lease holder writes, so a rolling update never runs two writers at once.
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args and "--leader-election-namespace=phalanx-system" in args
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert f"--health-port={ports['health']}" in container["args"]
    assert f"--metrics-port={ports['metrics']}" in container["args"]
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    entrypoint = json.loads(dockerfile.split("ENTRYPOINT", 1)[1].splitlines()[0])
    assert container["command"] == entrypoint == ["phalanx", "operator"]
    # Alive is not ready: /readyz says whether the stores are synced and the operator leads or stands by.
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert not any(arg.startswith("--namespace") for arg in container["args"])


@pytest.mark.parametrize("value_set", ["default", "namespaced"])
def test_operator_command_line_is_accepted_by_the_cli(value_set: str) -> None:
    from phalanx.cli import build_parser

    (container,) = the_deployment(rendered(value_set))["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args([*container["command"][1:], *container["args"]])
    assert args.command == "operator"
    assert args.health_port == 8081 and args.metrics_port == 8080
    assert (args.namespace or []) == (NAMESPACED_WATCH if value_set == "namespaced" else [])


def test_namespaced_install_watches_only_the_listed_namespaces() -> None:
    docs = rendered("namespaced")
    (container,) = the_deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert [arg for arg in container["args"] if arg.startswith("--namespace")] == [
        f"--namespace={ns}" for ns in NAMESPACED_WATCH
    ]
    roles = [r for r in of_kind(docs, "Role") if not r["metadata"]["name"].endswith("-leader-election")]
    bindings = [
        b for b in of_kind(docs, "RoleBinding") if not b["metadata"]["name"].endswith("-leader-election")
    ]
    assert sorted(role["metadata"]["namespace"] for role in roles) == NAMESPACED_WATCH
    assert sorted(binding["metadata"]["namespace"] for binding in bindings) == NAMESPACED_WATCH
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == "phalanx-system"
    (cluster_role,) = of_kind(docs, "ClusterRole")
    cluster_resources = {resource for rule in cluster_role["rules"] for resource in rule["resources"]}
    # pods: read-only everywhere, since gang admission counts every pod on a node; resourceflavors:
    # Kueue's are cluster-scoped (their node labels and tolerations go on a Kueue-admitted gang).
    assert cluster_resources == {
        "nodes",
        "priorityclasses",
        "customresourcedefinitions",
        "pods",
        "resourceflavors",
    }
    for rule in cluster_role["rules"]:
        assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule


# What the RBAC grants, verb by verb, is checked against the operator's own calls in
# test_rbac_matches_calls.py.


def test_leader_election_rbac_is_one_lease_in_the_release_namespace() -> None:
    docs = rendered("default")
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "phalanx-system"
    assert {tuple(rule["verbs"]) for rule in role["rules"]} == {("create",), ("get", "update")}
    assert all(
        rule.get("resourceNames") == ["phalanx-operator"] for rule in role["rules"] if "get" in rule["verbs"]
    )


def test_two_replicas_without_leader_election_are_refused(tmp_path: Path) -> None:
    values = {"replicaCount": 2, "leaderElection": {"enabled": False}}
    result = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, values=values, tmp=tmp_path)
    assert result.returncode != 0 and "needs leaderElection.enabled" in result.stderr


@pytest.mark.parametrize("value_set", ["default", "namespaced"])
def test_rbac_grants_nothing_dangerous(value_set: str) -> None:
    docs = rendered(value_set)
    for where, rule in rbac_rules(docs):
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(key, []), f"{where} uses a wildcard in {key}: {rule}"
        assert not rule.get("nonResourceURLs"), f"{where} grants non-resource URLs"
        forbidden = {"secrets", "pods/exec", "pods/attach", "pods/portforward", "serviceaccounts/token"}
        assert not forbidden & set(rule["resources"]), f"{where} grants {forbidden & set(rule['resources'])}"
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), f"{where}: {rule['verbs']}"
    assert not grants(docs, "", "configmaps", "create")
    assert not grants(docs, "", "nodes", "delete")
    assert not grants(docs, "apps", "deployments", "create")
    assert not grants(docs, "phalanx.dev", "trainingjobs", "create")
    assert not grants(docs, "", "pods", "update")


def test_monitoring_objects_render_only_when_asked_for_and_the_api_exists() -> None:
    kinds = {doc["kind"] for doc in rendered("monitoring")}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
    for value_set in ("default", "monitoring-without-api"):
        assert not {doc["apiVersion"] for doc in rendered(value_set)} & {f"{MONITORING_GROUP}/v1"}


def test_alerts_cover_admission_restarts_progress_and_checkpoints() -> None:
    (rule_object,) = of_kind(rendered("monitoring"), "PrometheusRule")
    rules = [rule for group in rule_object["spec"]["groups"] for rule in group["rules"]]
    alerts = {rule["alert"]: rule for rule in rules}
    assert {
        "PhalanxJobAdmissionWaitTooLong",
        "PhalanxJobRestartingOften",
        "PhalanxJobNoProgress",
        "PhalanxCheckpointTooOld",
    } <= set(alerts)
    assert "30 * 60" in alerts["PhalanxJobAdmissionWaitTooLong"]["expr"]
    assert "[15m]" in alerts["PhalanxJobNoProgress"]["expr"]
    for rule in rules:
        assert brackets_balance(rule["expr"]), rule["alert"]
        # Helm must leave Prometheus's own template variables for Alertmanager to expand.
        assert "$labels." in rule["annotations"]["summary"], rule["alert"]


def test_service_monitor_targets_the_metrics_service() -> None:
    docs = rendered("monitoring")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    services = [svc for svc in of_kind(docs, "Service") if svc["metadata"]["name"].endswith("-metrics")]
    (service,) = services
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert service["spec"]["selector"].items() <= (
        the_deployment(docs)["spec"]["template"]["metadata"]["labels"].items()
    )


def test_network_policy_admits_only_job_pods_and_listed_scrapers() -> None:
    docs = rendered("network-policy")
    policies = of_kind(docs, "NetworkPolicy")
    assert sorted(policy["metadata"]["namespace"] for policy in policies) == NAMESPACED_WATCH
    for policy in policies:
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        assert spec["podSelector"]["matchExpressions"] == [
            {"key": "phalanx.dev/job-name", "operator": "Exists"}
        ]
        peers, metrics_readers, controllers = spec["ingress"]
        assert peers["from"] == [{"podSelector": spec["podSelector"]}]
        assert "ports" not in peers  # every port between job pods (endPort needs CNI support)
        assert metrics_readers["ports"] == [{"protocol": "TCP", "port": 9400}]
        assert controllers["ports"] == [{"protocol": "TCP", "port": 9399}]
        assert controllers["from"] == [metrics_readers["from"][0]]  # the operator, and no one else
        operator, scraper = metrics_readers["from"]
        # The operator reads each trainer's /progress on the metrics port.
        assert operator["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "phalanx-system"
        }
        assert operator["podSelector"]["matchLabels"].items() <= (
            the_deployment(docs)["spec"]["template"]["metadata"]["labels"].items()
        )
        assert scraper == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
        }
    assert not of_kind(rendered("default"), "NetworkPolicy")


def test_dashboard_config_map_holds_the_committed_fresh_dashboard() -> None:
    (config_map,) = of_kind(rendered("default"), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["phalanx.json"])
    assert dashboard["uid"] == "phalanx-overview"
    assert len([panel for panel in dashboard["panels"] if panel["type"] != "row"]) >= 10
    check = subprocess.run(
        [sys.executable, str(CHART / "hack" / "build_dashboard.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


def test_the_lost_node_bound_reaches_the_operator_as_its_setting() -> None:
    (container,) = the_deployment(rendered("default"))["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PHALANX_NODE_LOST_AFTER_SECONDS"] == "20"


def test_the_progress_write_interval_reaches_the_operator_as_its_setting() -> None:
    (container,) = the_deployment(rendered("default"))["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PHALANX_PROGRESS_STATUS_SECONDS"] == "30"


def test_values_schema_rejects_bad_values(tmp_path: Path) -> None:
    bad_values: list[dict[str, Any]] = [
        {"watchNamespaces": ["Not_A_Namespace"]},
        {"operator": {"metricsPort": 0}},
        {"image": {"pullPolicy": "Sometimes"}},
        {"metrics": {"prometheusRule": {"thresholds": {"noProgressMinutes": 0}}}},
        {"replicas": 2},
        {"operator": {"nodeLostAfterSeconds": -1}},
        {"operator": {"progressStatusSeconds": 0}},
    ]
    for values in bad_values:
        result = helm(
            "template", "rel", str(CHART), "--kube-version", KUBE_VERSION, values=values, tmp=tmp_path
        )
        assert result.returncode != 0, f"accepted {values}"
        assert "schema" in result.stderr, result.stderr


def test_chart_crd_is_the_generated_crd() -> None:
    source = REPO_ROOT / "crds" / "phalanx.dev_trainingjobs.yaml"
    copy = CHART / "crds" / "phalanx.dev_trainingjobs.yaml"
    assert source.is_file(), f"{source} is missing: run `make crd`"
    assert copy.is_file(), f"{copy} is missing: run `make crd` (it copies the CRD into the chart)"
    assert yaml.safe_load(copy.read_text()) == yaml.safe_load(source.read_text())
    (crd,) = of_kind(rendered("default"), "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "trainingjobs.phalanx.dev"


def test_host_path_checkpoints_are_refused_unless_the_value_allows_them(tmp_path: Path) -> None:
    from phalanx.cli import build_parser

    def operator_args(values: dict[str, Any]) -> Any:
        result = helm(
            "template", "rel", str(CHART), "--kube-version", KUBE_VERSION, values=values, tmp=tmp_path
        )
        assert result.returncode == 0, result.stderr
        deployment = next(d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return build_parser().parse_args([*container["command"][1:], *container["args"]])

    assert operator_args({}).allow_host_path_checkpoints is False
    assert operator_args({"operator": {"allowHostPathCheckpoints": True}}).allow_host_path_checkpoints is True


def test_network_policy_can_close_the_control_port_to_other_job_pods() -> None:
    docs = rendered("network-policy-isolated")
    for policy in of_kind(docs, "NetworkPolicy"):
        peers = policy["spec"]["ingress"][0]
        # Every port between job pods but 9399: a pod of another job cannot POST a generation.
        assert peers["ports"] == [
            {"protocol": "TCP", "port": 1, "endPort": 9398},
            {"protocol": "TCP", "port": 9400, "endPort": 65535},
            {"protocol": "UDP"},
            {"protocol": "SCTP"},
        ]
