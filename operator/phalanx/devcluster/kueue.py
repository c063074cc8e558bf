"""A real Kueue beside the local control plane: its CRDs, its manager as a local process, its webhooks.

hack/kueue-bin.sh builds the manager from the sigs.k8s.io/kueue module and keeps the module's CRDs
and webhook manifests beside it. `start_kueue` applies the CRDs, writes the manager's Configuration,
gives it a serving cert from the dev cluster's CA for 127.0.0.1, and points Kueue's own webhook
configurations at `https://127.0.0.1:<port>/...` with that CA as caBundle (Kueue's internal cert
management is off: nothing in this cluster reaches a Service). Callers: `phalanx dev up --kueue`
(LocalCluster.up(kueue=...)) and the integration tests, which start it on the session's cluster.

The manifest builders are pure (tests/unit/test_kueue_dev.py); start/stop are the thin I/O around them.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from phalanx.constants import KUEUE_EXTERNAL_FRAMEWORK
from phalanx.devcluster import components
from phalanx.devcluster.pki import issue_serving_cert
from phalanx.devcluster.processes import process_alive
from phalanx.ports import free_port

if TYPE_CHECKING:
    from phalanx.devcluster.cluster import LocalCluster

KUEUE_NAMESPACE = "kueue-system"
KUEUE_GROUP = "kueue.x-k8s.io"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
# Integrations the dev cluster enables unless told otherwise: plain Jobs and plain pod groups.
DEFAULT_FRAMEWORKS = ("batch/job", "pod")
# Kueue then leaves pods owned by a TrainingJob to the operator.
DEFAULT_EXTERNAL_FRAMEWORKS = (KUEUE_EXTERNAL_FRAMEWORK,)
# Kueue's kustomize prefix; the names a real install has, so docs and kubectl read the same.
MUTATING_WEBHOOK_CONFIG = "kueue-mutating-webhook-configuration"
VALIDATING_WEBHOOK_CONFIG = "kueue-validating-webhook-configuration"
# Frameworks whose objects live in the core or apps group (named without a group in Kueue's config).
_GROUPLESS_FRAMEWORKS = {"pod": ("", "pods"), "deployment": ("apps", "deployments"),
                         "statefulset": ("apps", "statefulsets")}  # fmt: skip
# Namespaces Kueue's own install keeps its pod-level webhooks out of.
_SYSTEM_NAMESPACES = ("kube-system", KUEUE_NAMESPACE)


class KueueError(RuntimeError):
    """Kueue could not be built, found or started; the message names the fix or the log."""


@dataclass(frozen=True)
class WaitForPodsReady:
    """Kueue's waitForPodsReady: evict an admitted workload whose pods are not all Ready in time."""

    timeout_seconds: int = 300
    # Admit the next workload only once the admitted ones have all their pods Ready.
    block_admission: bool = True
    recovery_timeout_seconds: int | None = None

    def __post_init__(self) -> None:
        if self.timeout_seconds < 1:
            raise ValueError(f"waitForPodsReady.timeout_seconds must be >= 1, got {self.timeout_seconds}")
        if self.recovery_timeout_seconds is not None and self.recovery_timeout_seconds < 1:
            raise ValueError("waitForPodsReady.recovery_timeout_seconds must be >= 1 when set")


@dataclass(frozen=True)
class KueueSettings:
    frameworks: tuple[str, ...] = DEFAULT_FRAMEWORKS
    # Kind.version.group of job kinds that an outside controller integrates. TrainingJob is required
    # (docs/kueue.md): without it Kueue's pod integration takes the worker pods as workloads of their
    # own wherever a LocalQueue named `default` (LocalQueueDefaulting) or manageJobsWithoutQueueName applies.
    external_frameworks: tuple[str, ...] = DEFAULT_EXTERNAL_FRAMEWORKS
    wait_for_pods_ready: WaitForPodsReady | None = None
    # VisibilityOnDemand serves an extension API server whose cert Kueue reads from /visibility when
    # its internal cert management is off; the dev cluster does without it.
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: {"VisibilityOnDemand": False})

    def __post_init__(self) -> None:
        for name in self.frameworks:
            framework_resource(name)  # raises on a name it cannot map to a webhook rule


@dataclass(frozen=True)
class KueuePorts:
    webhook: int
    metrics: int
    health: int


@dataclass(frozen=True)
class KueueLayout:
    """What hack/kueue-bin.sh leaves in the cache for one version."""

    dir: Path

    @property
    def binary(self) -> Path:
        return self.dir / "bin" / "kueue"

    @property
    def crd_dir(self) -> Path:
        return self.dir / "crd"

    @property
    def webhook_manifests(self) -> Path:
        return self.dir / "webhook" / "manifests.yaml"

    def missing(self) -> list[str]:
        gaps = [str(p.relative_to(self.dir)) for p in (self.binary, self.webhook_manifests, self.crd_dir / "kustomization.yaml")
                if not p.is_file()]  # fmt: skip
        if not list((self.crd_dir / "bases").glob("*.yaml")):
            gaps.append("crd/bases/*.yaml")
        return gaps


@dataclass(frozen=True)
class KueueState:
    """What a running Kueue of a dev cluster is, kept in <state>/kueue/kueue.json."""

    pid: int
    ports: KueuePorts
    kueue_dir: str
    log: str

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.ports.webhook}"


# -- pure builders ---------------------------------------------------------------------------------
def framework_resource(framework: str) -> tuple[str, str]:
    """The (API group, resource) a Kueue framework name integrates: "batch/job" -> ("batch", "jobs")."""
    if framework in _GROUPLESS_FRAMEWORKS:
        return _GROUPLESS_FRAMEWORKS[framework]
    group, sep, kind = framework.rpartition("/")
    if not sep or not group or not kind:
        raise ValueError(
            f"Kueue framework {framework!r}: expected 'group/kind' (e.g. 'batch/job') or one of "
            f"{sorted(_GROUPLESS_FRAMEWORKS)}"
        )
    return group, kind.lower() + "s"


def manager_configuration(settings: KueueSettings, ports: KueuePorts, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for one manager on 127.0.0.1."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.metrics}"},
        "webhook": {"host": "127.0.0.1", "port": ports.webhook, "certDir": str(cert_dir)},
        # One manager per dev cluster; a lease would only delay its start.
        "leaderElection": {"leaderElect": False},
        # The webhooks are reached by URL with our CA, not through a Service with Kueue's own certs.
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(settings.frameworks)},
    }
    if settings.external_frameworks:
        config["integrations"]["externalFrameworks"] = list(settings.external_frameworks)
    ready = settings.wait_for_pods_ready
    if ready is not None:
        config["waitForPodsReady"] = {
            "timeout": f"{ready.timeout_seconds}s",
            "blockAdmission": ready.block_admission,
        }
        if ready.recovery_timeout_seconds is not None:
            config["waitForPodsReady"]["recoveryTimeout"] = f"{ready.recovery_timeout_seconds}s"
    if settings.feature_gates:
        config["featureGates"] = dict(settings.feature_gates)
    return config


def _webhook_wanted(webhook: Mapping[str, Any], wanted: set[tuple[str, str]]) -> bool:
    for rule in webhook.get("rules", []):
        for group in rule.get("apiGroups", []):
            if group == KUEUE_GROUP:
                return True
            if any((group, resource) in wanted for resource in rule.get("resources", [])):
                return True
    return False


def webhook_configurations(
    manifests: Iterable[Mapping[str, Any]], base_url: str, ca_bundle: bytes, frameworks: Sequence[str]
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, each webhook called at base_url + its path with our CA.

    Only the webhooks of Kueue's own kinds and of the enabled frameworks are kept: Kueue serves no
    handler for the others, and one left in (Deployment's, say) would refuse every such object.
    """
    wanted = {framework_resource(f) for f in frameworks}
    names = {"MutatingWebhookConfiguration": MUTATING_WEBHOOK_CONFIG,
             "ValidatingWebhookConfiguration": VALIDATING_WEBHOOK_CONFIG}  # fmt: skip
    encoded = base64.b64encode(ca_bundle).decode()
    out = []
    for doc in manifests:
        kind = doc.get("kind")
        if kind not in names:
            continue
        webhooks = []
        for hook in doc.get("webhooks", []):
            if not _webhook_wanted(hook, wanted):
                continue
            path = hook["clientConfig"]["service"]["path"]
            rewritten = {**hook, "clientConfig": {"url": base_url + path, "caBundle": encoded}}
            if any(g in ("", "apps") for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])):
                rewritten["namespaceSelector"] = {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(_SYSTEM_NAMESPACES)}
                ]}  # fmt: skip
            webhooks.append(rewritten)
        out.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                    "metadata": {"name": names[kind]}, "webhooks": webhooks})  # fmt: skip
    return out


def conversion_crd_names(
    kustomization: Mapping[str, Any], patches: Mapping[str, Mapping[str, Any]]
) -> set[str]:
    """The CRDs whose kustomization patches in a conversion webhook (`patches` maps path -> document)."""
    names = set()
    for entry in kustomization.get("patches") or []:
        doc = patches.get(entry["path"] if isinstance(entry, Mapping) else str(entry))
        if doc and doc.get("spec", {}).get("conversion", {}).get("strategy") == "Webhook":
            names.add(doc["metadata"]["name"])
    return names


def crd_manifests(
    crds: Iterable[Mapping[str, Any]], conversion: set[str], base_url: str, ca_bundle: bytes
) -> list[dict[str, Any]]:
    """Kueue's CRDs; those with a conversion webhook upstream get it at base_url/convert with our CA."""
    encoded = base64.b64encode(ca_bundle).decode()
    out = []
    for crd in crds:
        doc = dict(crd)
        if doc["metadata"]["name"] in conversion:
            doc["spec"] = {**doc["spec"], "conversion": {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": f"{base_url}/convert", "caBundle": encoded},
                "conversionReviewVersions": ["v1"],
            }}}  # fmt: skip
        out.append(doc)
    return out


# -- I/O ---------------------------------------------------------------------------------------
def resolve_kueue_dir() -> KueueLayout:
    """PHALANX_KUEUE_DIR, else the version-keyed cache that hack/kueue-bin.sh fills."""
    from phalanx.devcluster.cluster import REPO_ROOT

    configured = os.environ.get("PHALANX_KUEUE_DIR")
    if configured:
        layout = KueueLayout(Path(configured))
    else:
        script = REPO_ROOT / "hack" / "kueue-bin.sh"
        if not script.exists():
            raise KueueError("set PHALANX_KUEUE_DIR to a directory laid out as hack/kueue-bin.sh builds one")
        out = subprocess.run(["bash", str(script), "--print-dir"], capture_output=True, text=True, check=True)
        layout = KueueLayout(Path(out.stdout.strip()))
    missing = layout.missing()
    if missing:
        raise KueueError(
            f"Kueue is not built in {layout.dir} (missing {', '.join(missing)}). "
            "Run `make kueue-bin` (builds it from its Go module) or point PHALANX_KUEUE_DIR at a build."
        )
    return layout


def _state_dir(cluster: LocalCluster) -> Path:
    return cluster.state_dir / "kueue"


def kueue_state(cluster: LocalCluster) -> KueueState | None:
    """The running Kueue of this cluster, None when none runs."""
    path = _state_dir(cluster) / "kueue.json"
    try:
        raw = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    state = KueueState(raw["pid"], KueuePorts(**raw["ports"]), raw["kueue_dir"], raw["log"])
    return state if process_alive(state.pid) else None


# Kueue's Workload CRD is 1.4 MB of YAML: libyaml reads it in a fraction of pure Python's 4 s here.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_YAML_LOADER) if d]


def _wait_established(cluster: LocalCluster, names: Sequence[str], timeout: float) -> None:
    # Polled here: `kubectl wait` fails at once on a CRD whose status has no conditions yet.
    deadline = time.monotonic() + timeout
    pending = set(names)
    while time.monotonic() < deadline:
        listed = json.loads(cluster.kubectl("get", "crd", "-o", "json").stdout)["items"]
        established = {
            crd["metadata"]["name"]
            for crd in listed
            if any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (crd.get("status") or {}).get("conditions") or []
            )
        }
        pending = set(names) - established
        if not pending:
            return
        time.sleep(0.3)
    raise KueueError(f"Kueue's CRDs not Established after {timeout:.0f}s: {sorted(pending)}")


def _apply(cluster: LocalCluster, docs: Sequence[Mapping[str, Any]]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)})
    # Server-side: Kueue's Workload CRD is larger than client-side apply's annotation allows.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=phalanx-dev", "-f", "-",
                    input=body)  # fmt: skip


def start_kueue(
    cluster: LocalCluster, settings: KueueSettings | None = None, timeout: float = 120.0
) -> KueueState:
    """Installs Kueue's CRDs and webhooks into the running cluster and starts its manager.

    Returns when the manager is healthy and the API server gets answers from its webhooks. A Kueue
    already running for this cluster is returned as it is.
    """
    from phalanx.devcluster.cluster import ClusterError

    running = kueue_state(cluster)
    if running is not None:
        return running
    settings = settings or KueueSettings()
    layout = resolve_kueue_dir()
    started = time.monotonic()
    home = _state_dir(cluster)
    home.mkdir(parents=True, exist_ok=True)
    ports = KueuePorts(webhook=free_port(), metrics=free_port(), health=free_port())
    base_url = f"https://127.0.0.1:{ports.webhook}"
    ca = cluster.pki.ca_cert.read_bytes()

    cert_dir = home / "certs"
    crt, key = issue_serving_cert(cluster.pki, cert_dir, "kueue-webhook", ("IP:127.0.0.1", "DNS:localhost"))
    metrics_dir = home / "etc-upper" / components.KUEUE_METRICS_CERT_DIR.removeprefix("/etc/")
    metrics_dir.mkdir(parents=True, exist_ok=True)
    for source in (crt, key):
        (metrics_dir / source.name).write_bytes(source.read_bytes())
    (home / "etc-work").mkdir(exist_ok=True)
    config_path = home / "config.yaml"
    config_path.write_text(yaml.safe_dump(manager_configuration(settings, ports, cert_dir), sort_keys=False))

    crd_dir = layout.crd_dir
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text()) or {}
    patches = {
        str(p.relative_to(crd_dir)): yaml.safe_load(p.read_text()) for p in crd_dir.glob("patches/*.yaml")
    }
    crds = [doc for p in sorted((crd_dir / "bases").glob("*.yaml")) for doc in _load_yaml_docs(p)]
    try:
        _apply(cluster, crd_manifests(crds, conversion_crd_names(kustomization, patches), base_url, ca))
        _wait_established(cluster, [c["metadata"]["name"] for c in crds], timeout)
        cluster.log(f"Kueue: {len(crds)} CRDs established ({time.monotonic() - started:.1f}s)")
        cluster.kubectl("create", "namespace", KUEUE_NAMESPACE, check=False)
    except ClusterError as exc:
        raise KueueError(f"installing Kueue's CRDs failed: {exc}") from exc

    component = components.kueue_manager(layout.binary, config_path, cluster.kubeconfig, home / "etc-upper",
                                         home / "etc-work", as_root=os.geteuid() == 0)  # fmt: skip
    pid = cluster.start_component(component)
    state = KueueState(pid, ports, str(layout.dir), str(cluster.log_file("kueue")))
    (home / "kueue.json").write_text(json.dumps(asdict(state), indent=2))
    try:
        _wait_healthy(cluster, state, timeout)
        cluster.log(f"Kueue: manager ready ({time.monotonic() - started:.1f}s)")
        webhooks = webhook_configurations(
            _load_yaml_docs(layout.webhook_manifests), base_url, ca, settings.frameworks
        )
        _apply(cluster, webhooks)
        _wait_webhooks_answer(cluster, state, timeout)
    except BaseException:
        stop_kueue(cluster, unregister=True)
        raise
    cluster.log(f"Kueue ready in {time.monotonic() - started:.1f}s (webhooks at {base_url}, log {state.log})")
    return state


def _manager_exited(cluster: LocalCluster, state: KueueState) -> KueueError | None:
    if process_alive(state.pid):
        return None
    return KueueError(
        f"the Kueue manager exited during start-up; its log is {state.log}:\n{_tail(Path(state.log))}"
    )


def _wait_healthy(cluster: LocalCluster, state: KueueState, timeout: float) -> None:
    url = f"http://127.0.0.1:{state.ports.health}/readyz"
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        exited = _manager_exited(cluster, state)
        if exited:
            raise exited
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.3)
    raise KueueError(f"Kueue not ready after {timeout:.0f}s at {url} ({last}); its log is {state.log}:\n"
                     f"{_tail(Path(state.log))}")  # fmt: skip


def _wait_webhooks_answer(cluster: LocalCluster, state: KueueState, timeout: float) -> None:
    """A server-side dry run passes through Kueue's mutating and validating webhooks: proof of the path."""
    probe = {
        "apiVersion": f"{KUEUE_GROUP}/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "phalanx-webhook-probe"},
    }
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        exited = _manager_exited(cluster, state)
        if exited:
            raise exited
        result = cluster.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False
        )
        if result.returncode == 0:
            return
        last = result.stderr.strip()
        time.sleep(0.5)
    raise KueueError(f"the API server gets no answer from Kueue's webhooks at {state.webhook_url} after "
                     f"{timeout:.0f}s: {last}; Kueue's log is {state.log}")  # fmt: skip


def stop_kueue(cluster: LocalCluster, unregister: bool = False) -> bool:
    """Stops this cluster's Kueue; True when one was running.

    With `unregister` (a cluster that goes on without Kueue) its webhook configurations and CRD
    conversion webhooks are removed first, so the API server calls no dead endpoint afterwards.
    """
    from phalanx.devcluster.cluster import terminate

    home = _state_dir(cluster)
    if unregister:
        cluster.kubectl(
            "delete",
            "mutatingwebhookconfiguration",
            MUTATING_WEBHOOK_CONFIG,
            "--ignore-not-found",
            check=False,
        )
        cluster.kubectl("delete", "validatingwebhookconfiguration", VALIDATING_WEBHOOK_CONFIG, "--ignore-not-found",
                        check=False)  # fmt: skip
        listed = cluster.kubectl("get", "crd", "-o", "json", check=False)
        if listed.returncode == 0:
            for crd in json.loads(listed.stdout)["items"]:
                if (
                    crd["spec"]["group"] == KUEUE_GROUP
                    and crd["spec"].get("conversion", {}).get("strategy") == "Webhook"
                ):
                    cluster.kubectl("patch", "crd", crd["metadata"]["name"], "--type=json", "-p",
                                    '[{"op": "replace", "path": "/spec/conversion", "value": {"strategy": "None"}}]',
                                    check=False)  # fmt: skip
    state_file = home / "kueue.json"
    was_running = False
    try:
        pid = json.loads(state_file.read_text())["pid"]
    except (FileNotFoundError, ValueError, KeyError):
        pid = None
    if pid is not None and process_alive(pid):
        terminate(pid)
        was_running = True
    state_file.unlink(missing_ok=True)
    (cluster.state_dir / "run" / "kueue.pid").unlink(missing_ok=True)
    return was_running


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
