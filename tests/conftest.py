"""Shared fixtures: one real local control plane per test session, one namespace per test.

The cluster (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok) starts only when
a test asks for it. Set PHALANX_TEST_KUBECONFIG to reuse a cluster started by `phalanx dev up`
(quicker when iterating on one test).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from phalanx.devcluster.cluster import LocalCluster, default_state_dir
from phalanx.devcluster.kueue import (
    KueueError,
    KueueState,
    kueue_state,
    resolve_kueue_dir,
    start_kueue,
    stop_kueue,
)
from phalanx.devcluster.nodes import DEFAULT_POOLS, NodePool, node_manifests

REPO_ROOT = Path(__file__).resolve().parents[1]

# Under pytest-xdist (`make test` runs `-n 2 --dist loadscope`) each worker is its own test session
# with its own cluster and operator. The torch-heavy tests (tests/e2e training, tests/trainer) form one
# scope, so they run one after another on one worker instead of fighting for the 2 cores, while the
# other worker takes the integration tests, which mostly wait on real timers. Every other file is a
# scope of its own, so its module-scoped fixtures (a reference run, a trained model) are built once.
# (xdist's own loadgroup cannot group with pytest 9: it renames item._nodeid, which pytest 9 dropped.)
TORCH_GROUP = "torch"
TORCH_HEAVY_DIRS = ("tests/e2e/", "tests/trainer/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadscope":
        return None  # xdist's own scheduler for the mode asked for
    from xdist.scheduler import LoadScopeScheduling

    class TorchHeavyTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return TORCH_GROUP if path.startswith(TORCH_HEAVY_DIRS) else path

    return TorchHeavyTogether(config, log)


@dataclass
class Cluster:
    kubeconfig: str
    bin_dir: Path
    local: LocalCluster

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]], namespace: str | None = None) -> None:
        items = manifest if isinstance(manifest, list) else [manifest]
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        extra = ["-n", namespace] if namespace else []
        self.kubectl("apply", "-f", "-", *extra, input=body)

    def api(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig)

    def kube_client(self) -> Any:
        """The operator's own client (kube_client.KubeClient), logged in as the admin."""
        from phalanx.kube_client import KubeClient, kubeconfig_credentials

        return KubeClient(kubeconfig_credentials(Path(self.kubeconfig)))

    def add_nodes(self, pools: Sequence[NodePool]) -> list[str]:
        return self.local.add_nodes(pools) if pools else []

    def delete_nodes(self, names: Sequence[str]) -> None:
        if names:
            self.kubectl("delete", "node", "--wait=false", "--ignore-not-found", *names)


def wait_for(predicate: Any, timeout: float = 60.0, interval: float = 0.5, what: str = "condition") -> Any:
    """Polls until predicate() returns something truthy; fails the test with `what` otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reuse = os.environ.get("PHALANX_TEST_KUBECONFIG")
    if reuse:
        local = LocalCluster(Path(reuse).parent if Path(reuse).name == "kubeconfig" else default_state_dir())
        state = local.state()
        assert state is not None, f"PHALANX_TEST_KUBECONFIG={reuse} has no phalanx cluster state beside it"
        yield Cluster(reuse, Path(state.bin_dir), local)
        return
    local = LocalCluster(tmp_path_factory.mktemp("cluster"))
    kubeconfig = local.up(DEFAULT_POOLS)
    state = local.state()
    assert state is not None
    try:
        yield Cluster(str(kubeconfig), Path(state.bin_dir), local)
    finally:
        local.down(quiet=True)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    short = request.node.name.lower().replace("_", "-")
    short = "".join(ch for ch in short if ch.isalnum() or ch == "-")[:40].strip("-")
    name = create_namespace(cluster, f"{short}-{uuid.uuid4().hex[:5]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def create_namespace(cluster: Cluster, name: str) -> str:
    """Creates `name` and waits for its default service account (pods are refused until it exists)."""
    cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=30,
        what=f"default service account in {name}",
    )
    return name


@pytest.fixture
def private_nodes(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Creates simulated nodes only the calling test uses: tainted and labelled with a unique key.

    Pods reach them with `tolerations` + `nodeSelector` from the returned helper, so tests that
    count capacity do not see each other's pods.
    """
    created: list[str] = []
    tag = uuid.uuid4().hex[:6]

    class PrivateNodes:
        label = {"phalanx.dev/test-pool": tag}
        toleration = {
            "key": "phalanx.dev/test-pool",
            "operator": "Equal",
            "value": tag,
            "effect": "NoSchedule",
        }

        def add(self, count: int, gpus: int = 8, prefix: str = "p", **kwargs: Any) -> list[str]:
            pool = NodePool(
                name_prefix=f"{prefix}-{tag}",
                count=count,
                gpus=gpus,
                labels={**self.label, **kwargs.pop("labels", {})},
                taints=(("phalanx.dev/test-pool", tag, "NoSchedule"),),
                **kwargs,
            )
            names = cluster.add_nodes([pool])
            created.extend(names)
            wait_for(
                lambda: all(_node_ready(cluster, n) for n in names), timeout=60, what=f"nodes {names} Ready"
            )
            return names

        def placement(self) -> dict[str, Any]:
            return {"nodeSelector": dict(self.label), "tolerations": [dict(self.toleration)]}

    yield PrivateNodes()
    cluster.delete_nodes(created)


SILENCED_HOLDER = "phalanx-test-silenced"
SILENCED_ANNOTATION = "phalanx.dev/sim-silenced"


def silence_node(cluster: Cluster, name: str) -> None:
    """Makes a kwok node stop heartbeating, as on a network partition or a hung kubelet.

    kwok renews a node's Lease (kube-node-lease/<node>) only while it holds it: handing the Lease to
    another holder with a long duration, without touching renewTime, ends the renewals. The node
    lifecycle controller then sees no heartbeat, marks the node Unknown after
    --node-monitor-grace-period (40 s here) and taints it node.kubernetes.io/unreachable. The node and
    the pods on it are annotated phalanx.dev/sim-silenced, for which kwok plays no stage
    (kwok-stages.yaml): they stay as they are, a deleted pod Terminating for good."""
    patch = {"spec": {"holderIdentity": SILENCED_HOLDER, "leaseDurationSeconds": 86400}}
    cluster.kubectl("patch", "lease", name, "-n", "kube-node-lease", "--type=merge", "-p", json.dumps(patch))
    cluster.kubectl("annotate", "node", name, f"{SILENCED_ANNOTATION}=true", "--overwrite")
    cluster.kubectl("annotate", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={name}",
                    f"{SILENCED_ANNOTATION}=true", "--overwrite")  # fmt: skip


def node_ready_status(cluster: Cluster, name: str) -> str:
    node = cluster.get_json("node", name)
    ready = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
    return str(ready[0]["status"]) if ready else ""


def _node_ready(cluster: Cluster, name: str) -> bool:
    node = cluster.get_json("node", name)
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", [])
    )


__all__ = ["Cluster", "wait_for", "node_manifests"]


CHART = REPO_ROOT / "charts" / "phalanx"
OPERATOR_IDENTITY_NAMESPACE = "phalanx-test-operator"


def operator_kubeconfig(cluster: Cluster, directory: Path) -> Path:
    """A kubeconfig for the chart's service account, bound to the chart's own RBAC.

    The tests' operator then runs with exactly the rights a Helm install grants, not as the
    cluster admin (system:masters passes every RBAC check and OwnerReferencesPermissionEnforcement,
    so a missing rule would go unnoticed)."""
    import yaml

    ns = OPERATOR_IDENTITY_NAMESPACE
    if cluster.kubectl("get", "namespace", ns, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", ns)
    rendered = subprocess.run(
        [str(cluster.bin_dir / "helm"), "template", "phalanx-test", str(CHART), "--namespace", ns,
         "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml",
         "--show-only", "templates/leader-election-rbac.yaml"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=rendered)
    account = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ServiceAccount")
    name = account["metadata"]["name"]
    token = cluster.kubectl("create", "token", name, "-n", ns, "--duration=24h").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": server}],
        "users": [{"name": f"system:serviceaccount:{ns}:{name}", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "dev", "user": f"system:serviceaccount:{ns}:{name}"}}],
        "current-context": "operator",
    }  # fmt: skip
    path = directory / "operator-kubeconfig"
    path.write_text(json.dumps(config))
    return path


class OperatorProcess:
    """`phalanx operator` as a subprocess against the test cluster (what the image runs), with the
    chart's service account and RBAC (operator_kubeconfig)."""

    def __init__(self, cluster: Cluster, log_dir: Path, kubeconfig: Path | None = None) -> None:
        self.cluster = cluster
        self.log_dir = log_dir
        self.kubeconfig = str(kubeconfig) if kubeconfig is not None else cluster.kubeconfig
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # As a pod's name: a restart (after kill()) renews its own lease at once.
        self.identity = f"test-operator-{uuid.uuid4().hex[:6]}"

    def start(
        self,
        extra_env: dict[str, str] | None = None,
        extra_args: Sequence[str] = (),
        allow_host_path_checkpoints: bool = True,
    ) -> None:
        """`allow_host_path_checkpoints`: as the dev cluster runs it (the chart's default is off)."""
        import sys

        self.starts += 1
        log = (self.log_dir / f"operator-{self.starts}.log").open("wb")
        env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            # As in the chart's pod: the Lease lives in the operator's namespace, named after the pod.
            "POD_NAME": self.identity,
            "POD_NAMESPACE": OPERATOR_IDENTITY_NAMESPACE,
            # The e2e tests sample status.progress while a short run trains: every second, not the
            # chart's 30 s (policy/progress_writes.py).
            "PHALANX_PROGRESS_STATUS_SECONDS": "1",
            **(extra_env or {}),
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "phalanx.cli",
                "operator",
                "--metrics-port",
                "0",
                "--health-port",
                "0",
                "--allow-host-path-checkpoints"
                if allow_host_path_checkpoints
                else "--no-allow-host-path-checkpoints",
                *extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log")))


@pytest.fixture(scope="session")
def crd_installed(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))
    from phalanx.devcluster.crds import wait_established

    wait_established([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"],
                     ["trainingjobs.phalanx.dev"])  # fmt: skip


@pytest.fixture(scope="session")
def operator_process(
    cluster: Cluster, crd_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log_dir = tmp_path_factory.mktemp("operator")
    op = OperatorProcess(cluster, log_dir, operator_kubeconfig(cluster, log_dir))
    op.start()
    yield op
    op.stop()


@pytest.fixture
def operator(operator_process: OperatorProcess) -> OperatorProcess:
    """The shared operator, restarted first if an earlier test stopped or killed it."""
    operator_process.ensure_running()
    return operator_process


# -- dev node: a node that really runs pods as local processes (phalanx.devnode) ------------------


@dataclass
class RealNode:
    """One dev-node agent registered in the test cluster; pods reach it with `placement()`."""

    name: str
    state_dir: Path

    def placement(self) -> dict[str, Any]:
        return {
            "nodeSelector": {"kubernetes.io/hostname": self.name},
            "tolerations": [
                {"key": "phalanx.dev/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
            ],
        }

    def log(self, namespace: str, pod: str, container: str) -> str:
        path = self.state_dir / "logs" / f"{namespace}_{pod}_{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def start_dev_node_agent(
    cluster: Cluster, name: str, state_dir: Path, extra_args: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """A dev-node agent (its own name, state dir and pod address range), in a session of its own so
    that a test can stop or kill it alone; returns once its Node is Ready."""
    import sys

    from phalanx.devcluster.realnode import check_real_node_preflight
    from phalanx.devnode.network import default_ip_prefix

    check_real_node_preflight()  # one line naming the missing library and the fix, before any wait
    argv = [
        sys.executable, "-m", "phalanx.devnode", "--kubeconfig", cluster.kubeconfig, "--name", name,
        "--state-dir", str(state_dir), "--ip-prefix", default_ip_prefix(f"{state_dir}:{name}"),
        "--workdir", str(REPO_ROOT), *extra_args,
    ]  # fmt: skip
    with (state_dir / "agent.log").open("ab") as log:
        agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _node_ready_or_missing(cluster, name), timeout=60, what=f"dev node {name} Ready")
    except BaseException:
        stop_dev_node_agent(cluster, name, agent)
        raise
    return agent


def stop_dev_node_agent(cluster: Cluster, name: str, agent: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the agent stops its pods' processes), SIGKILL to its group after 20 s; the Node goes."""
    import signal

    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    cluster.kubectl("delete", "node", "--wait=false", "--ignore-not-found", name, check=False)


@pytest.fixture(scope="session")
def real_node(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """A dev-node agent for this test session (its own name, state dir and pod address range)."""
    name = f"real-{uuid.uuid4().hex[:6]}"
    state_dir = tmp_path_factory.mktemp("devnode")
    agent = start_dev_node_agent(cluster, name, state_dir)
    try:
        yield RealNode(name, state_dir)
    finally:
        stop_dev_node_agent(cluster, name, agent)


def _node_ready_or_missing(cluster: Cluster, name: str) -> bool:
    found = cluster.kubectl("get", "node", name, "-o", "json", check=False)
    if found.returncode != 0:
        return False
    node = json.loads(found.stdout)
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", [])
    )


# -- Kueue (sigs.k8s.io/kueue, hack/kueue-bin.sh) beside the local control plane -----------------


@pytest.fixture(scope="module")
def kueue(cluster: Cluster) -> Iterator[KueueState]:
    """Kueue on the session's cluster for this module (tests/integration/test_kueue_*.py, tests/e2e/test_kueue_e2e.py);
    unregistered afterwards so later tests see none."""
    try:
        resolve_kueue_dir()
    except KueueError as exc:
        if shutil.which("go") is None:
            pytest.skip(f"Kueue is not built and go is missing to build it: {exc}")
        pytest.fail(str(exc))
    already = kueue_state(cluster.local)  # `phalanx dev up --kueue` with PHALANX_TEST_KUBECONFIG
    state = already or start_kueue(cluster.local)
    try:
        yield state
    finally:
        if already is None:
            stop_kueue(cluster.local, unregister=True)
