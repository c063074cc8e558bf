"""Starts and stops dev-node agents (phalanx.devnode) beside a local cluster, one pid file each.

LocalCluster.up/down call these; each agent registers one Node that runs pods as local processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from phalanx.devcluster.processes import process_alive
from phalanx.devnode.network import default_ip_prefix
from phalanx.devnode.preflight import check_name_resolution, default_nss_wrapper

REAL_NODE_PREFIX = "real-node"


def real_node_names(count: int) -> list[str]:
    return [f"{REAL_NODE_PREFIX}-{index}" for index in range(count)]


def agent_state_dir(cluster_state_dir: Path, node_name: str) -> Path:
    return cluster_state_dir / "devnodes" / node_name


def _pid_file(cluster_state_dir: Path, node_name: str) -> Path:
    return cluster_state_dir / "run" / f"devnode-{node_name}.pid"


def check_real_node_preflight() -> None:
    """Raises PreflightError (one line: what is missing and the fix) before anything long starts."""
    check_name_resolution(default_nss_wrapper(), sys.executable)


def start_real_nodes(
    cluster_state_dir: Path, kubeconfig: Path, count: int, cpu: str | None = None, workdir: Path | None = None
) -> list[str]:
    """Starts `count` agents in the background (logs in <state>/logs/devnode-<name>.log)."""
    check_real_node_preflight()
    names = real_node_names(count)
    for index, name in enumerate(names):
        state_dir = agent_state_dir(cluster_state_dir, name)
        state_dir.mkdir(parents=True, exist_ok=True)
        log_file = cluster_state_dir / "logs" / f"devnode-{name}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "phalanx.devnode",
            "--kubeconfig", str(kubeconfig),
            "--name", name,
            "--state-dir", str(state_dir),
            # One /24 per agent of this cluster, so their pods never share an address.
            "--ip-prefix", default_ip_prefix(f"{cluster_state_dir}:{index}"),
        ]  # fmt: skip
        if cpu:
            argv += ["--cpu", cpu]
        if workdir:
            argv += ["--workdir", str(workdir)]
        with log_file.open("ab") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        pid_file = _pid_file(cluster_state_dir, name)
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(str(proc.pid))
    return names


def wait_real_nodes_ready(kubectl: list[str], names: list[str], timeout: float = 60.0) -> None:
    """`kubectl` is the argv prefix with --kubeconfig; raises TimeoutError naming the nodes not Ready."""
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending and time.monotonic() < deadline:
        out = subprocess.run([*kubectl, "get", "nodes", "-o", "json"], capture_output=True, text=True)
        if out.returncode == 0:
            ready = {
                n["metadata"]["name"]
                for n in json.loads(out.stdout)["items"]
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
            }
            pending = [name for name in names if name not in ready]
        if pending:
            time.sleep(0.3)
    if pending:
        raise TimeoutError(f"dev nodes not Ready after {timeout:.0f}s: {pending}")


def stop_real_nodes(cluster_state_dir: Path, grace: float = 15.0) -> list[str]:
    """SIGTERM each agent (it stops its pods' processes), SIGKILL after `grace`; returns the names stopped."""
    stopped = []
    for pid_file in sorted((cluster_state_dir / "run").glob("devnode-*.pid")):
        name = pid_file.stem.removeprefix("devnode-")
        try:
            pid = int(pid_file.read_text().strip())
        except ValueError:
            pid_file.unlink(missing_ok=True)
            continue
        if process_alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if process_alive(pid):
                os.killpg(pid, signal.SIGKILL)
            stopped.append(name)
        pid_file.unlink(missing_ok=True)
    return stopped


__all__ = [
    "check_real_node_preflight",
    "start_real_nodes",
    "stop_real_nodes",
    "wait_real_nodes_ready",
    "real_node_names",
]
