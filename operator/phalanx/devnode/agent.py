"""The node agent: registers a Node, keeps it Ready, and runs the pods bound to it as local processes.

One loop owns all state. It wakes on any watch event for this node's pods (or every
`resync_seconds`), lists those pods and moves each one a step: start, report, terminate, remove.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client import ApiException
from urllib3.exceptions import HTTPError

from phalanx.devnode import node as node_objects
from phalanx.devnode.bindshim import build_bind_shim
from phalanx.devnode.containers import (
    ContainerConfigError,
    LocalCommand,
    PodContext,
    build_local_command,
    prepend_path_list,
)
from phalanx.devnode.network import IpPool, PodAddress, peer_pod_addresses, render_hosts, resolver_env
from phalanx.devnode.podstatus import ContainerState, exit_code_of, orphan_status, pod_status
from phalanx.devnode.preflight import check_name_resolution, default_nss_wrapper
from phalanx.devnode.processes import POD_UID_ENV, ContainerProcess, kill_leftover_group, log_path, spawn
from phalanx.devnode.volumes import materialize, plan_volumes

PYHOOK_DIR = Path(__file__).with_name("pyhook")
POD_IP_ENV = "PHALANX_DEVNODE_POD_IP"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
TERMINAL_PHASES = ("Succeeded", "Failed")
DEFAULT_GRACE_SECONDS = 30
# Under heartbeat_seconds: a slow peer list must not hold the loop past a beat.
PEER_LIST_TIMEOUT_SECONDS = 5.0
# What a request to the API server can raise: refused or failed answers, broken or slow connections.
API_ERRORS = (ApiException, OSError, HTTPError)


@dataclass(frozen=True)
class AgentConfig:
    shape: node_objects.NodeShape
    state_dir: Path
    ip_prefix: str
    python: str = sys.executable
    default_workdir: str = os.getcwd()
    nss_wrapper: str = field(default_factory=default_nss_wrapper)
    cluster_domain: str = "cluster.local"
    heartbeat_seconds: float = 10.0
    resync_seconds: float = 2.0

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def hosts_file(self) -> Path:
        return self.state_dir / "hosts"

    def pod_dir(self, uid: str) -> Path:
        return self.state_dir / "pods" / uid


@dataclass
class PodRuntime:
    """What the agent holds for one pod it started."""

    uid: str
    namespace: str
    name: str
    address: PodAddress
    start_time: float
    states: dict[str, ContainerState]
    processes: dict[str, ContainerProcess] = field(default_factory=dict)
    kill_at: float | None = None  # set once SIGTERM went out: when SIGKILL follows
    killed: bool = False
    last_reported: dict[str, Any] | None = None
    final_reported: bool = False

    def finished(self) -> bool:
        return all(state.terminated for state in self.states.values())


class Agent:
    def __init__(self, api_client: client.ApiClient, config: AgentConfig, log: Any = None) -> None:
        self.api_client = api_client
        # Untyped on purpose: bodies go out as plain dicts and answers come back as raw JSON.
        self.core: Any = client.CoreV1Api(api_client)
        self.coordination: Any = client.CoordinationV1Api(api_client)
        self.config = config
        self.pool = IpPool(config.ip_prefix)
        self.pods: dict[str, PodRuntime] = {}
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.node_uid = ""
        self.ready_since = time.time()
        self._last_beat = 0.0
        self._hosts_text = ""
        self._peers: list[PodAddress] = []  # other dev nodes' running pods, as of the last good list
        self._peers_listed_at = float("-inf")  # monotonic
        self._peer_error = ""  # the last peer-list error logged: a repeat is not logged again
        self._host_lines = _read_host_lines()
        self.log = log or (lambda msg: print(f"devnode: {msg}", file=sys.stderr, flush=True))
        self.bind_shim = build_bind_shim(config.state_dir / "lib")
        if self.bind_shim is None:
            self.log("no C compiler: only Python listeners get pod-local ports (see docs/dev-node.md)")

    # -- node ------------------------------------------------------------------------------
    def register(self) -> None:
        manifest = node_objects.node_manifest(self.config.shape)
        name = self.config.shape.name
        try:
            created = self.core.create_node(manifest, _preload_content=False)
            self.node_uid = json.loads(created.data)["metadata"]["uid"]
        except ApiException as exc:
            if exc.status != 409:
                raise
            patched = self.core.patch_node(
                name, manifest, _content_type=STRATEGIC_MERGE, _preload_content=False
            )
            self.node_uid = json.loads(patched.data)["metadata"]["uid"]
        self.heartbeat(force=True)
        self.log(f"node {name} registered (pod addresses {self.config.ip_prefix}.0/24)")

    def heartbeat(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_beat < self.config.heartbeat_seconds:
            return
        status = node_objects.node_status(self.config.shape, now, self.ready_since)
        self.core.patch_node_status(self.config.shape.name, {"status": status}, _content_type=STRATEGIC_MERGE)
        lease = node_objects.lease_manifest(self.config.shape.name, self.node_uid, now)
        try:
            self.coordination.patch_namespaced_lease(
                lease["metadata"]["name"], node_objects.LEASE_NAMESPACE, lease, _content_type=STRATEGIC_MERGE
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.coordination.create_namespaced_lease(node_objects.LEASE_NAMESPACE, lease)
        self._last_beat = now

    # -- loop ------------------------------------------------------------------------------
    def run(self) -> None:
        # Before the Node exists: a node that cannot resolve pod names must never be given a pod.
        check_name_resolution(self.config.nss_wrapper, self.config.python)
        self.kill_leftovers()
        self.register()
        threading.Thread(target=self._watch_pods, name="devnode-watch", daemon=True).start()
        while not self.stopping.is_set():
            failed = False
            try:
                self.sync_once()
            except API_ERRORS as exc:
                self.log(f"sync failed, retrying: {exc}")
                failed = True
            # Apart from the sync: whatever fails there, the Node must stay Ready.
            try:
                self.heartbeat()
            except API_ERRORS as exc:
                self.log(f"heartbeat failed, retrying: {exc}")
                failed = True
            if failed:
                time.sleep(1.0)
            self.wake.wait(self._next_wait())
            self.wake.clear()
        self.shutdown()

    def _next_wait(self) -> float:
        # While a pod is terminating, look again soon: SIGKILL is due at a precise time.
        if any(rt.kill_at is not None and not rt.final_reported for rt in self.pods.values()):
            return 0.2
        if any(rt.processes and not rt.final_reported for rt in self.pods.values()):
            return 0.5  # exits are noticed by polling the processes
        return self.config.resync_seconds

    def _watch_pods(self) -> None:
        selector = f"spec.nodeName={self.config.shape.name}"
        while not self.stopping.is_set():
            try:
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.core.list_pod_for_all_namespaces, field_selector=selector, timeout_seconds=60
                )
                for _event in stream:
                    self.wake.set()
                    if self.stopping.is_set():
                        return
            except Exception as exc:  # noqa: BLE001 - the loop's periodic resync covers any gap
                self.log(f"pod watch interrupted ({type(exc).__name__}); reconnecting")
                time.sleep(1.0)

    def sync_once(self) -> None:
        response = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.config.shape.name}", _preload_content=False
        )
        pods = json.loads(response.data)["items"]
        seen = set()
        for pod in pods:
            seen.add(pod["metadata"]["uid"])
            self._step(pod)
        for uid in [uid for uid in self.pods if uid not in seen]:
            # Gone from the API without us (force deletion): nothing to report, stop what runs.
            runtime = self.pods.pop(uid)
            self._signal(runtime, signal.SIGKILL)
            self.pool.release(uid)
            shutil.rmtree(self.config.pod_dir(uid), ignore_errors=True)
        self._refresh_peers()
        self._write_hosts()

    def _refresh_peers(self) -> None:
        """The other dev nodes' pods, listed at most once per resync (a pod's own events wake the
        loop far more often). A failed list keeps the last peers: an API server may refuse it (a node
        authorizer that lets a node see only its own pods) and the node must run its pods regardless."""
        now = time.monotonic()
        if now - self._peers_listed_at < self.config.resync_seconds:
            return
        self._peers_listed_at = now
        try:
            response = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName!={self.config.shape.name},status.phase=Running",
                _preload_content=False,
                _request_timeout=PEER_LIST_TIMEOUT_SECONDS,
            )
            self._peers = peer_pod_addresses(json.loads(response.data)["items"])
        except (*API_ERRORS, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if error != self._peer_error:
                self.log(
                    f"listing the other dev nodes' pods failed; keeping the last {len(self._peers)}: {error}"
                )
                self._peer_error = error
            return
        self._peer_error = ""

    # -- one pod ---------------------------------------------------------------------------
    def _step(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        deleting = bool(meta.get("deletionTimestamp"))
        runtime = self.pods.get(uid)
        if runtime is None:
            phase = (pod.get("status") or {}).get("phase")
            if phase in TERMINAL_PHASES or deleting:
                if deleting:
                    self._remove(pod)
                return
            if (pod.get("status") or {}).get("startTime"):
                self.log(
                    f"{meta['namespace']}/{meta['name']}: started by an earlier agent run; marking Failed"
                )
                self._patch_status(meta["namespace"], meta["name"], orphan_status(pod, time.time()))
                return
            self._start(pod)
            return
        self._reap(runtime)
        if deleting and runtime.kill_at is None:
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
            runtime.kill_at = time.monotonic() + float(grace)
            self._signal(runtime, signal.SIGTERM)
            self._mark_unstarted_terminated(runtime)
            self.log(f"{runtime.namespace}/{runtime.name}: SIGTERM, SIGKILL in {grace}s if still running")
        if runtime.kill_at is not None and not runtime.killed and time.monotonic() >= runtime.kill_at:
            if any(p.returncode() is None for p in runtime.processes.values()):
                self.log(f"{runtime.namespace}/{runtime.name}: grace period over, SIGKILL")
            self._signal(runtime, signal.SIGKILL)
            runtime.killed = True
        self._report(runtime)
        if runtime.final_reported:
            if deleting:
                self._remove(pod)
            self._forget(runtime)

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid, namespace, name = meta["uid"], meta["namespace"], meta["name"]
        ip = self.pool.allocate(uid)
        address = PodAddress(ip, spec.get("hostname") or name, spec.get("subdomain") or "", namespace)
        containers = spec.get("containers") or []
        runtime = PodRuntime(
            uid,
            namespace,
            name,
            address,
            time.time(),
            {c["name"]: ContainerState(c["name"], c.get("image", "")) for c in containers},
        )
        self.pods[uid] = runtime
        pod_dir = self.config.pod_dir(uid)
        try:
            if spec.get("initContainers"):
                raise ContainerConfigError("initContainers are not supported by the dev node")
            plans = plan_volumes(pod, pod_dir, self.config.state_dir / "claims", self._read_config_map)
            context = self._context(ip, materialize(plans))
            commands = {
                c["name"]: build_local_command(pod, c, context, self._base_env(runtime)) for c in containers
            }
        except ContainerConfigError as err:
            # As a kubelet does: the container waits with the reason; the pod stays Pending.
            for cname, state in runtime.states.items():
                runtime.states[cname] = ContainerState(
                    cname, state.image, reason="CreateContainerConfigError", message=str(err)
                )
            self.log(f"{namespace}/{name}: cannot run: {err}")
            self._report(runtime, message=str(err))
            return
        self._write_hosts()  # the pod must resolve its own name from its first instruction
        for cname, command in commands.items():
            self._add_preloads(command.env)
            self._spawn(runtime, cname, command, pod_dir)
        self.log(f"{namespace}/{name}: started at {ip}")
        self._report(runtime)

    def _spawn(self, runtime: PodRuntime, cname: str, command: LocalCommand, pod_dir: Path) -> None:
        log_file = log_path(self.config.logs_dir, runtime.namespace, runtime.name, cname)
        image = runtime.states[cname].image
        try:
            process = spawn(
                command, log_file, f"pod uid {runtime.uid} container {cname}: {' '.join(command.argv)}"
            )
        except OSError as err:
            now = time.time()
            runtime.states[cname] = ContainerState(
                cname, image, now, now, 128, "StartError", f"{type(err).__name__}: {err}"
            )
            return
        started = ContainerProcess(cname, process)
        runtime.processes[cname] = started
        runtime.states[cname] = ContainerState(cname, image, started.started_at)
        pod_dir.mkdir(parents=True, exist_ok=True)
        (pod_dir / f"{cname}.pid").write_text(str(process.pid))

    def _reap(self, runtime: PodRuntime) -> None:
        for cname, proc in runtime.processes.items():
            state = runtime.states[cname]
            if state.terminated:
                continue
            code = proc.returncode()
            if code is None:
                continue
            # The group may outlive its leader (a worker the launcher left behind): end it too.
            proc.signal_group(signal.SIGKILL)
            runtime.states[cname] = ContainerState(
                cname, state.image, state.started_at, time.time(), exit_code_of(code)
            )
            self.config.pod_dir(runtime.uid).joinpath(f"{cname}.pid").unlink(missing_ok=True)

    def _mark_unstarted_terminated(self, runtime: PodRuntime) -> None:
        now = time.time()
        for cname, state in runtime.states.items():
            if state.started_at is None and not state.terminated:
                runtime.states[cname] = ContainerState(cname, state.image, None, now, 137, "ContainerCannotRun",
                                                       state.message)  # fmt: skip

    def _report(self, runtime: PodRuntime, message: str = "") -> None:
        states = list(runtime.states.values())
        status = pod_status(
            states,
            runtime.address.ip,
            self.config.shape.host_ip,
            runtime.start_time,
            time.time(),
            message=message,
        )
        comparable = {k: v for k, v in status.items() if k != "conditions"}
        if comparable == runtime.last_reported:
            return
        self._patch_status(runtime.namespace, runtime.name, status)
        runtime.last_reported = comparable
        if runtime.finished():
            runtime.final_reported = True
            codes = {s.name: s.exit_code for s in states}
            self.log(f"{runtime.namespace}/{runtime.name}: {status['phase']} (exit codes {codes})")

    def _forget(self, runtime: PodRuntime) -> None:
        self.pods.pop(runtime.uid, None)
        self.pool.release(runtime.uid)

    def _remove(self, pod: dict[str, Any]) -> None:
        """The kubelet's last word on a deleted pod: remove it now that nothing of it runs."""
        meta = pod["metadata"]
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], body=body, grace_period_seconds=0
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
        shutil.rmtree(self.config.pod_dir(meta["uid"]), ignore_errors=True)

    def _patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(
                name, namespace, {"status": status}, _content_type=STRATEGIC_MERGE
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _signal(self, runtime: PodRuntime, signum: int) -> None:
        for proc in runtime.processes.values():
            if signum == signal.SIGKILL or proc.returncode() is None:
                proc.signal_group(signum)

    # -- environment -----------------------------------------------------------------------
    def _context(self, ip: str, volume_dirs: dict[str, str]) -> PodContext:
        return PodContext(
            pod_ip=ip,
            node_name=self.config.shape.name,
            host_ip=self.config.shape.host_ip,
            volume_dirs=volume_dirs,
            python=self.config.python,
            venv_bin=str(Path(self.config.python).parent),
            default_workdir=self.config.default_workdir,
        )

    def _base_env(self, runtime: PodRuntime) -> dict[str, str]:
        venv_bin = str(Path(self.config.python).parent)
        env = {
            "PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "HOSTNAME": runtime.address.hostname,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",  # logs appear as written, as with a container's pipe
            **resolver_env(self.config.hosts_file, runtime.address.hostname),
            "GLOO_SOCKET_IFNAME": "lo",
            POD_IP_ENV: runtime.address.ip,
            POD_UID_ENV: runtime.uid,
        }
        return env

    def _add_preloads(self, env: dict[str, str]) -> None:
        """After the container's env, so that a template setting LD_PRELOAD or PYTHONPATH keeps them."""
        if self.bind_shim is not None:
            prepend_path_list(env, "LD_PRELOAD", str(self.bind_shim), ":")
        else:
            prepend_path_list(env, "PYTHONPATH", str(PYHOOK_DIR), ":")
        prepend_path_list(env, "LD_PRELOAD", self.config.nss_wrapper, ":")

    def _write_hosts(self) -> None:
        addresses = [rt.address for rt in self.pods.values() if not rt.final_reported]
        text = render_hosts(addresses, self._host_lines, self.config.cluster_domain, self._peers)
        if text == self._hosts_text:
            return
        # Replace, never rewrite in place: a process may be reading the file right now.
        partial = self.config.hosts_file.with_suffix(".partial")
        partial.write_text(text)
        partial.replace(self.config.hosts_file)
        self._hosts_text = text

    def _read_config_map(self, namespace: str, name: str) -> dict[str, str]:
        try:
            response = self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                raise ContainerConfigError(f"configMap {name!r} not found") from exc
            raise
        data: dict[str, str] = json.loads(response.data).get("data") or {}
        return data

    # -- start and stop --------------------------------------------------------------------
    def kill_leftovers(self) -> None:
        pods_dir = self.config.state_dir / "pods"
        for pid_file in sorted(pods_dir.glob("*/*.pid")) if pods_dir.exists() else []:
            if kill_leftover_group(pid_file, pid_file.parent.name):
                self.log(f"killed a process group left by an earlier agent run ({pid_file})")

    def shutdown(self, grace: float = 5.0) -> None:
        """Stops every pod's processes (a dev tool must not leave them behind); statuses stay as they are."""
        for runtime in self.pods.values():
            self._signal(runtime, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(
            p.returncode() is None for rt in self.pods.values() for p in rt.processes.values()
        ):
            time.sleep(0.1)
        for runtime in self.pods.values():
            self._signal(runtime, signal.SIGKILL)
        self.log("stopped")


def _read_host_lines() -> str:
    try:
        return Path("/etc/hosts").read_text()
    except OSError:
        return "127.0.0.1 localhost\n::1 localhost\n"
