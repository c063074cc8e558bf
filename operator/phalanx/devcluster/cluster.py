"""Starts, checks and stops the local control plane as background processes.

State lives in one directory (default ~/.local/state/phalanx/<name>): certificates, etcd data,
kubeconfig, one log file and one pid file per component. `down` stops every process it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phalanx.devcluster import components
from phalanx.devcluster.nodes import DEFAULT_POOLS, NodePool, node_manifests, without_capacity
from phalanx.devcluster.pki import Pki, ensure_pki
from phalanx.devcluster.processes import process_alive
from phalanx.ports import free_port

if TYPE_CHECKING:
    from phalanx.devcluster.kueue import KueueSettings

REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok", "kubectl")
STAGES_FILE = Path(__file__).with_name("kwok-stages.yaml")
# Starts of the control plane when a port it chose is taken before a component binds it.
PORT_ATTEMPTS = 3
PORT_TAKEN = "address already in use"
REPO_ROOT = Path(__file__).resolve().parents[3]


class ClusterError(RuntimeError):
    """A failure with one clear message for the person running the command."""


def default_state_dir(name: str = "default") -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "phalanx" / name


def resolve_bin_dir() -> Path:
    """PHALANX_CLUSTER_BIN, else the version-keyed cache that hack/cluster-bin.sh fills."""
    configured = os.environ.get("PHALANX_CLUSTER_BIN")
    if configured:
        bin_dir = Path(configured)
    else:
        script = REPO_ROOT / "hack" / "cluster-bin.sh"
        if not script.exists():
            raise ClusterError(
                "set PHALANX_CLUSTER_BIN to a directory with etcd, kube-apiserver, ... and kwok"
            )
        out = subprocess.run(["bash", str(script), "--print-dir"], capture_output=True, text=True, check=True)
        bin_dir = Path(out.stdout.strip())
    missing = [b for b in REQUIRED_BINARIES if not (bin_dir / b).is_file()]
    if missing:
        raise ClusterError(
            f"missing cluster binaries in {bin_dir}: {', '.join(missing)}. "
            "Run `make cluster-bin` (builds them from Go modules) or point PHALANX_CLUSTER_BIN at them."
        )
    return bin_dir


def kubeconfig_text(server: str, pki: Pki, context: str = "phalanx-dev") -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": context, "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)}}
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate": str(pki.admin_cert), "client-key": str(pki.admin_key)},
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": context, "user": "admin"}}],
        "current-context": context,
    }
    return json.dumps(config, indent=2)


@dataclass
class ClusterState:
    name: str
    ports: components.Ports
    bin_dir: str
    started_at: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str) -> ClusterState:
        raw = json.loads(text)
        return ClusterState(raw["name"], components.Ports(**raw["ports"]), raw["bin_dir"], raw["started_at"])


class LocalCluster:
    def __init__(self, state_dir: Path, log: Callable[[str], None] | None = None) -> None:
        self.state_dir = state_dir
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    # -- paths ---------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Pki:
        return Pki(self.state_dir / "pki")

    def _pid_file(self, name: str) -> Path:
        return self.state_dir / "run" / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "cluster.json"

    def state(self) -> ClusterState | None:
        if not self._state_file.exists():
            return None
        return ClusterState.from_json(self._state_file.read_text())

    # -- lifecycle -----------------------------------------------------------------------------
    def up(
        self,
        pools: Sequence[NodePool] = DEFAULT_POOLS,
        timeout: float = 120.0,
        real_nodes: int = 0,
        kueue: KueueSettings | bool = False,
    ) -> Path:
        """Starts the control plane and kwok's nodes; `real_nodes` dev-node agents run pods as processes.

        `kueue` (True or KueueSettings) also runs a real Kueue against it (phalanx.devcluster.kueue).
        """
        started = time.monotonic()
        if self.running_components():
            raise ClusterError(
                f"a cluster is already running from {self.state_dir}; run `phalanx dev down` first"
            )
        if real_nodes:
            from phalanx.devcluster.realnode import check_real_node_preflight
            from phalanx.devnode.preflight import PreflightError

            try:
                check_real_node_preflight()
            except PreflightError as exc:
                raise ClusterError(str(exc)) from exc
        bin_dir = resolve_bin_dir()
        if kueue:
            from phalanx.devcluster.kueue import KueueError, resolve_kueue_dir

            try:
                resolve_kueue_dir()  # before anything starts: a missing build is a one-line error
            except KueueError as exc:
                raise ClusterError(str(exc)) from exc
        for sub in ("run", "logs"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        pki = ensure_pki(self.state_dir / "pki")
        try:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                try:
                    self._start_control_plane(bin_dir, pki, timeout)
                    break
                except ClusterError as exc:
                    # A free port is only free until someone binds it: another cluster starting, or
                    # a test's rendezvous, may take it between our check and the component's bind.
                    if PORT_TAKEN not in str(exc) or attempt == PORT_ATTEMPTS:
                        raise
                    self.log(f"a port was taken before its component bound it; starting again ({exc})")
                    self.down(quiet=True)
            self.add_nodes(pools)
            self._wait_nodes_ready(timeout)
            self._wait_default_service_account(timeout)
            if real_nodes:
                from phalanx.devcluster.realnode import start_real_nodes, wait_real_nodes_ready

                names = start_real_nodes(self.state_dir, self.kubeconfig, real_nodes, workdir=REPO_ROOT)
                wait_real_nodes_ready(
                    [str(bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}"], names, timeout
                )
                self.log(f"development node(s) running pods as local processes: {', '.join(names)}")
            if kueue:
                from phalanx.devcluster.kueue import KueueError, KueueSettings, start_kueue

                try:
                    start_kueue(self, kueue if isinstance(kueue, KueueSettings) else KueueSettings(), timeout)
                except KueueError as exc:
                    raise ClusterError(str(exc)) from exc
        except Exception:
            self.down(quiet=True)
            raise
        self.log(f"cluster ready in {time.monotonic() - started:.1f}s; kubeconfig: {self.kubeconfig}")
        return self.kubeconfig

    def _start_control_plane(self, bin_dir: Path, pki: Pki, timeout: float) -> None:
        """etcd, the API server, the scheduler, the controller manager and kwok, on fresh ports."""
        shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
        first = free_port(consecutive=6)  # six ports, none alike
        ports = components.Ports(*range(first, first + 6))
        self._state_file.write_text(ClusterState("dev", ports, str(bin_dir), time.time()).to_json())
        server = f"https://127.0.0.1:{ports.apiserver}"
        self.kubeconfig.write_text(kubeconfig_text(server, pki))
        self._start(components.etcd(bin_dir, self.state_dir / "etcd", ports))
        self._wait_http(f"http://127.0.0.1:{ports.etcd_client}/health", "etcd", timeout)
        self._start(components.kube_apiserver(bin_dir, pki, ports))
        self._wait_http(f"{server}/readyz", "kube-apiserver", timeout)
        self._start(components.kube_scheduler(bin_dir, self.kubeconfig, ports))
        self._start(components.kube_controller_manager(bin_dir, self.kubeconfig, pki, ports))
        self._start(components.kwok(bin_dir, self.kubeconfig, STAGES_FILE, ports))
        self._wait_http(f"https://127.0.0.1:{ports.scheduler}/healthz", "kube-scheduler", timeout)
        self._wait_http(f"https://127.0.0.1:{ports.controller_manager}/healthz", "kube-controller-manager",
                        timeout)  # fmt: skip

    def down(self, quiet: bool = False) -> list[str]:
        from phalanx.devcluster.kueue import stop_kueue
        from phalanx.devcluster.realnode import stop_real_nodes

        # Kueue first: it talks to the API server until its end.
        stopped = ["kueue"] if stop_kueue(self) else []
        stopped += stop_real_nodes(self.state_dir)
        # Reverse start order: node simulator and controllers first, etcd last.
        for name in ("kwok", "kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd"):
            pid = self._read_pid(name)
            if pid is None:
                continue
            if process_alive(pid):
                terminate(pid)
                stopped.append(name)
            self._pid_file(name).unlink(missing_ok=True)
        if not quiet:
            self.log(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return stopped

    def running_components(self) -> dict[str, int]:
        running = {}
        for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok"):
            pid = self._read_pid(name)
            if pid is not None and process_alive(pid):
                running[name] = pid
        return running

    def status(self) -> dict[str, Any]:
        state = self.state()
        running = self.running_components()
        ready = False
        if state is not None and "kube-apiserver" in running:
            try:
                self._get(f"https://127.0.0.1:{state.ports.apiserver}/readyz")
                ready = True
            except (urllib.error.URLError, OSError):
                ready = False
        from phalanx.devcluster.kueue import kueue_state

        kueue = kueue_state(self)
        kueue_info = (
            None if kueue is None else {"pid": kueue.pid, "webhooks": kueue.webhook_url, "log": kueue.log}
        )
        return {
            "state_dir": str(self.state_dir),
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.exists() else None,
            "running": running,
            "api_ready": ready,
            "kueue": kueue_info,
        }

    # -- nodes -----------------------------------------------------------------------------
    def kubectl_argv(self) -> list[str]:
        """The kubectl binary and --kubeconfig for this cluster (the prefix of every kubectl call)."""
        state = self.state()
        if state is None:
            raise ClusterError("no cluster state; run `phalanx dev up` first")
        return [str(Path(state.bin_dir) / "kubectl"), f"--kubeconfig={self.kubeconfig}"]

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [*self.kubectl_argv(), *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def add_nodes(self, pools: Sequence[NodePool]) -> list[str]:
        manifests = node_manifests(pools)
        if not manifests:
            return []
        # Node status is written through the status subresource: create, then patch capacity.
        for m in manifests:
            body = {k: v for k, v in m.items() if k != "status"}
            self.kubectl("apply", "-f", "-", input=json.dumps(body))
        lost = manifests
        for _ in range(30):  # kwok's own first status write may drop the capacity: write it again
            for m in lost:
                self.kubectl("patch", "node", m["metadata"]["name"], "--subresource=status", "--type=merge",
                             "-p", json.dumps({"status": m["status"]}))  # fmt: skip
            lost = without_capacity(
                json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"], manifests
            )
            if not lost:
                return [m["metadata"]["name"] for m in manifests]
            time.sleep(1)
        names = ", ".join(m["metadata"]["name"] for m in lost)
        raise ClusterError(f"nodes {names} still have no capacity after 30 writes of their status")

    def start_component(self, component: components.Component) -> int:
        """Starts a process beside the control plane (Kueue), logged and pid-filed like the others."""
        return self._start(component)

    # -- internals -------------------------------------------------------------------------
    def _start(self, component: components.Component) -> int:
        log = self.log_file(component.name).open("ab")
        proc = subprocess.Popen(
            component.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._pid_file(component.name).write_text(str(proc.pid))
        self.log(f"started {component.name} (pid {proc.pid}, log {self.log_file(component.name)})")
        return proc.pid

    def _read_pid(self, name: str) -> int | None:
        try:
            return int(self._pid_file(name).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _get(self, url: str) -> bytes:
        context = self._ssl_context() if url.startswith("https") else None
        if url.startswith("https") and ":" in url.split("//")[1] and "/healthz" in url:
            # Scheduler and controller-manager serve self-signed certs; only liveness is read there.
            context = ssl._create_unverified_context()
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            body: bytes = response.read()
            return body

    def _wait_http(self, url: str, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = ""
        while time.monotonic() < deadline:
            pid = self._read_pid(name)
            if pid is not None and not process_alive(pid):
                tail = _tail(self.log_file(name))
                raise ClusterError(f"{name} exited during start-up; last log lines:\n{tail}")
            try:
                self._get(url)
                return
            except (urllib.error.URLError, OSError) as exc:
                last_error = str(exc)
            time.sleep(0.3)
        raise ClusterError(
            f"{name} not healthy after {timeout:.0f}s at {url}: {last_error}\n{_tail(self.log_file(name))}"
        )

    def _wait_nodes_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.kubectl("get", "nodes", "-o", "json").stdout
            items = json.loads(out)["items"]
            not_ready = [
                n["metadata"]["name"]
                for n in items
                if not any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
            ]
            if not not_ready:
                return
            time.sleep(0.5)
        raise ClusterError(f"nodes not Ready after {timeout:.0f}s: {not_ready}; see {self.log_file('kwok')}")

    def _wait_default_service_account(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0:
                return
            time.sleep(0.5)
        raise ClusterError("the default service account never appeared; see kube-controller-manager's log")


def down_on_sigterm() -> None:
    """A process that brings a LocalCluster up and down in try/finally (the benchmarks) tears it
    down on SIGTERM too: Python's default handling ends the process without running `finally`,
    and the cluster's processes, in no group that dies with it, kept spinning."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def terminate(pid: int, grace: float = 10.0) -> None:
    """SIGTERM to the process group `pid` leads, SIGKILL after `grace` seconds."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
