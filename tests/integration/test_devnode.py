"""The dev node runs real pods: exit codes, logs, graceful deletion, pod DNS and a gloo all-reduce."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, RealNode, wait_for

pytestmark = pytest.mark.integration


def pod(
    name: str,
    node: RealNode,
    script: str,
    *,
    env: list[dict[str, Any]] | None = None,
    subdomain: str = "",
    grace: int = 30,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    args: list[str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        **node.placement(),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
        "hostname": name,
        "automountServiceAccountToken": False,
        "volumes": volumes or [],
        "containers": [
            {
                "name": "main",
                "image": "ignored-by-the-dev-node",
                "command": ["python", "-c", textwrap.dedent(script)] if script else ["python"],
                "args": args or [],
                "env": env or [],
                "volumeMounts": mounts or [],
            }
        ],
    }
    if subdomain:
        spec["subdomain"] = subdomain
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "devnode-test"}},
        "spec": spec,
    }


def phase_of(cluster: Cluster, namespace: str, name: str) -> str:
    found = cluster.kubectl(
        "get", "pod", name, "-n", namespace, "-o", "jsonpath={.status.phase}", check=False
    )
    return found.stdout if found.returncode == 0 else "<gone>"


def terminated(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status = cluster.get_json("pod", name, "-n", namespace)["status"]
    state: dict[str, Any] = status["containerStatuses"][0]["state"]["terminated"]
    return state


def wait_phase(
    cluster: Cluster, namespace: str, name: str, phases: tuple[str, ...], timeout: float = 40
) -> str:
    found: str = wait_for(
        lambda: (p := phase_of(cluster, namespace, name)) in phases and p,
        timeout=timeout,
        what=f"pod {name} in {phases}",
    )
    return found


def test_a_pod_that_exits_0_succeeds_with_its_env_and_log(
    cluster: Cluster, namespace: str, real_node: RealNode
) -> None:
    env = [
        {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "GREETING", "value": "hello from $(MY_POD)"},
    ]
    cluster.apply(pod("printer", real_node, "import os; print(os.environ['GREETING'], os.environ['MY_IP'])", env=env),
                  namespace)  # fmt: skip

    assert wait_phase(cluster, namespace, "printer", ("Succeeded", "Failed")) == "Succeeded"
    state = terminated(cluster, namespace, "printer")
    assert (state["exitCode"], state["reason"]) == (0, "Completed")
    pod_ip = cluster.get_json("pod", "printer", "-n", namespace)["status"]["podIP"]
    assert pod_ip.startswith("127.") and pod_ip != "127.0.0.1"
    assert f"hello from printer {pod_ip}" in real_node.log(namespace, "printer", "main")


def test_a_pod_that_exits_3_fails_with_exit_code_3(
    cluster: Cluster, namespace: str, real_node: RealNode
) -> None:
    cluster.apply(pod("exits-3", real_node, "import sys; print('giving up'); sys.exit(3)"), namespace)

    assert wait_phase(cluster, namespace, "exits-3", ("Succeeded", "Failed")) == "Failed"
    state = terminated(cluster, namespace, "exits-3")
    assert (state["exitCode"], state["reason"]) == (3, "Error")
    assert "giving up" in real_node.log(namespace, "exits-3", "main")


TRAPS_SIGTERM = """
    import os, pathlib, signal, sys, time
    work = pathlib.Path(os.environ["WORK"])
    marker = work / "marker"
    def stop(signum, frame):
        marker.write_text("sigterm")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    (work / "ready").write_text("ready")
    while True:
        time.sleep(0.1)
"""

IGNORES_SIGTERM = """
    import os, pathlib, signal, time
    work = pathlib.Path(os.environ["WORK"])
    signal.signal(signal.SIGTERM, lambda signum, frame: (work / "marker").write_text("ignored"))
    (work / "ready").write_text("ready")
    while True:
        time.sleep(0.1)
"""


@pytest.mark.parametrize(
    ("script", "grace", "marker"),
    [(TRAPS_SIGTERM, 30, "sigterm"), (IGNORES_SIGTERM, 2, "ignored")],
    ids=["exits-on-sigterm", "sigkill-after-grace"],
)
def test_a_deleted_pod_gets_sigterm_then_is_removed(
    cluster: Cluster,
    namespace: str,
    real_node: RealNode,
    tmp_path: Path,
    script: str,
    grace: int,
    marker: str,
) -> None:
    # hostPath is used as is; the dev node rewrites the mount path /work in env values to it.
    volumes = [{"name": "work", "hostPath": {"path": str(tmp_path), "type": "Directory"}}]
    mounts = [{"name": "work", "mountPath": "/work"}]
    env = [{"name": "WORK", "value": "/work"}]
    manifest = pod("sleeper", real_node, script, env=env, grace=grace, volumes=volumes, mounts=mounts)
    cluster.apply(manifest, namespace)
    wait_for(lambda: (tmp_path / "ready").exists(), timeout=30, what="the process to start")
    assert phase_of(cluster, namespace, "sleeper") == "Running"

    cluster.kubectl("delete", "pod", "sleeper", "-n", namespace, "--wait=false")

    wait_for(
        lambda: phase_of(cluster, namespace, "sleeper") == "<gone>", timeout=grace + 20, what="pod removed"
    )
    assert (tmp_path / "marker").read_text() == marker


PEER = """
    import os, socket, sys, time
    me, peer = os.environ["ME"], os.environ["PEER"]
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 7000))  # both pods use port 7000: each gets its own address
    server.listen(1)
    deadline = time.time() + 30
    while True:
        try:
            address = socket.getaddrinfo(peer, 7000, socket.AF_INET)[0][4]
            with socket.create_connection(address, timeout=2) as conn:
                conn.sendall(me.encode())
            break
        except OSError:
            if time.time() > deadline:
                sys.exit("peer unreachable")
            time.sleep(0.2)
    conn, _ = server.accept()
    print(f"{me} resolved {peer} to {address[0]} and heard from {conn.recv(100).decode()}")
"""


def test_two_pods_resolve_each_others_names_and_connect(
    cluster: Cluster, namespace: str, real_node: RealNode
) -> None:
    cluster.apply(headless_service("peers"), namespace)
    fqdn = f"{{}}.peers.{namespace}.svc.cluster.local"
    for me, peer in (("peer-a", "peer-b"), ("peer-b", "peer-a")):
        env = [{"name": "ME", "value": me}, {"name": "PEER", "value": fqdn.format(peer)}]
        cluster.apply(pod(me, real_node, PEER, env=env, subdomain="peers"), namespace)

    for name in ("peer-a", "peer-b"):
        assert wait_phase(cluster, namespace, name, ("Succeeded", "Failed")) == "Succeeded", real_node.log(
            namespace, name, "main"
        )
    ip_b = cluster.get_json("pod", "peer-b", "-n", namespace)["status"]["podIP"]
    assert f"peer-a resolved {fqdn.format('peer-b')} to {ip_b} and heard from peer-b" in real_node.log(
        namespace, "peer-a", "main"
    )
    assert "heard from peer-a" in real_node.log(namespace, "peer-b", "main")


ALL_REDUCE = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} all-reduced {total.item()}")
dist.destroy_process_group()
"""


def test_gloo_all_reduce_between_two_pods(cluster: Cluster, namespace: str, real_node: RealNode) -> None:
    cluster.apply(headless_service("gang"), namespace)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "scripts"},
            "data": {"reduce.py": ALL_REDUCE},
        },
        namespace,
    )
    master = f"gang-0.gang.{namespace}.svc.cluster.local"
    for rank in (0, 1):
        env = [
            {"name": "MASTER_ADDR", "value": master},
            {"name": "MASTER_PORT", "value": str(29400 + int(namespace[-5:], 16) % 500)},
            {"name": "WORLD_SIZE", "value": "2"},
            {"name": "RANK", "value": str(rank)},
        ]
        volumes = [{"name": "scripts", "configMap": {"name": "scripts"}}]
        mounts = [{"name": "scripts", "mountPath": "/opt/scripts"}]
        manifest = pod(f"gang-{rank}", real_node, "", env=env, subdomain="gang", volumes=volumes, mounts=mounts,
                       args=["/opt/scripts/reduce.py"])  # fmt: skip
        cluster.apply(manifest, namespace)

    for rank in (0, 1):
        name = f"gang-{rank}"
        phase = wait_phase(cluster, namespace, name, ("Succeeded", "Failed"), timeout=60)
        assert phase == "Succeeded", real_node.log(namespace, name, "main")
        assert f"rank {rank} of 2 all-reduced 3.0" in real_node.log(namespace, name, "main")


def headless_service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"clusterIP": "None", "selector": {"app": "devnode-test"}, "ports": [{"port": 7000}]},
    }


def test_an_agent_restart_kills_what_it_left_and_fails_those_pods(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import uuid

    name = f"restart-{uuid.uuid4().hex[:6]}"
    state_dir = tmp_path / "agent"
    argv = [sys.executable, "-m", "phalanx.devnode", "--kubeconfig", cluster.kubeconfig, "--name", name,
            "--state-dir", str(state_dir), "--ip-prefix", "127.251.7"]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    node = RealNode(name, state_dir)
    env = [{"name": "WORK", "value": str(tmp_path)}]
    first = start()
    try:
        wait_for(
            lambda: cluster.kubectl("get", "node", name, check=False).returncode == 0, timeout=30, what="node"
        )
        cluster.apply(pod("orphan", node, TRAPS_SIGTERM, env=env), namespace)
        wait_for(lambda: (tmp_path / "ready").exists(), timeout=30, what="the process to start")
        pid_file = next((state_dir / "pods").glob("*/main.pid"))
        old_process = int(pid_file.read_text())
        first.send_signal(signal.SIGKILL)  # a crash: no chance to stop the pod's processes
        first.wait()
        assert _alive(old_process)

        second = start()
        try:
            wait_phase(cluster, namespace, "orphan", ("Failed",), timeout=30)
            status = cluster.get_json("pod", "orphan", "-n", namespace)["status"]
            assert status["reason"] == "NodeAgentRestarted"
            wait_for(lambda: not _alive(old_process), timeout=10, what="the orphaned process to be killed")
            assert not (tmp_path / "marker").exists()  # SIGKILL, as for any process of a lost pod
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=20)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        cluster.kubectl("delete", "node", name, "--wait=false", "--ignore-not-found", check=False)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def test_a_shell_command_line_sees_its_mount_paths(
    cluster: Cluster, namespace: str, real_node: RealNode, tmp_path: Path
) -> None:
    """`sh -c "cp /scripts/x.py /work && cd /work && python x.py"`, as user manifests write it."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "scripts"},
        "data": {"hello.py": "import os; print('ran from', os.getcwd(), 'with', sorted(os.listdir('.')))"},
    }
    manifest = pod(
        "shell-line",
        real_node,
        "",
        volumes=[{"name": "scripts", "configMap": {"name": "scripts"}}, {"name": "work", "emptyDir": {}}],
        mounts=[{"name": "scripts", "mountPath": "/scripts"}, {"name": "work", "mountPath": "/work"}],
    )
    container = manifest["spec"]["containers"][0]
    container["command"] = ["sh", "-c"]
    container["args"] = [
        "cp /scripts/hello.py /work && cd /work && python hello.py && test -f '/work/hello.py'"
    ]
    cluster.apply(config_map, namespace)
    cluster.apply(manifest, namespace)
    phase = wait_phase(cluster, namespace, "shell-line", ("Succeeded", "Failed"))
    log = real_node.log(namespace, "shell-line", "main")
    assert phase == "Succeeded", log
    assert terminated(cluster, namespace, "shell-line")["exitCode"] == 0
    assert "with ['hello.py']" in log  # copied from the configMap volume into the emptyDir, then run there


@pytest.mark.parametrize("library", ["missing", "broken"])
def test_a_node_whose_resolver_library_is_missing_or_broken_refuses_to_start(
    cluster: Cluster, namespace: str, tmp_path: Path, library: str
) -> None:
    """One line naming the library and the fix; no Node registered, so no pod can ever start there."""
    import subprocess
    import sys
    import uuid

    name = f"nonss-{uuid.uuid4().hex[:6]}"
    nss_wrapper = tmp_path / "libnss_wrapper.so"
    if library == "broken":
        nss_wrapper.write_text("not a shared object\n")
    state_dir = tmp_path / "agent"
    # A pod already bound to the node's name: a node that started anyway would run it.
    bound = pod("bound-early", RealNode(name, state_dir), "print('started')")
    bound["spec"]["nodeName"] = name
    cluster.apply(bound, namespace)
    argv = [sys.executable, "-m", "phalanx.devnode", "--kubeconfig", cluster.kubeconfig, "--name", name,
            "--state-dir", str(state_dir), "--ip-prefix", "127.251.9", "--nss-wrapper", str(nss_wrapper)]  # fmt: skip
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 3, result.stderr
        assert len(lines) == 1, result.stderr
        assert str(nss_wrapper) in lines[0] and "apt-get install -y libnss-wrapper" in lines[0]
        assert ("is missing" if library == "missing" else "does not resolve") in lines[0]
        assert cluster.kubectl("get", "node", name, check=False).returncode != 0  # never registered
        assert not (state_dir / "pods").exists()  # nothing was started
        assert phase_of(cluster, namespace, "bound-early") == "Pending"
    finally:
        cluster.kubectl("delete", "node", name, "--wait=false", "--ignore-not-found", check=False)
