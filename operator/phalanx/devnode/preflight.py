"""Checks, before a dev node registers, that its pods' processes will resolve cluster DNS names.

Pods find each other by name (`worker-0.job.ns.svc.cluster.local`) through the agent's hosts file,
which their processes read through nss_wrapper (LD_PRELOAD). When that library is missing or cannot
be loaded, the dynamic loader only warns and the names never resolve: a trainer then waits minutes
for its rendezvous peer. The probe runs the same setup in a child process and resolves one name, so
a node that cannot run pods never registers and the user gets one line with the fix instead.
"""

from __future__ import annotations

import os
import platform
import subprocess
import tempfile
from pathlib import Path

from phalanx.devnode.network import resolver_env

INSTALL_HINT = "install it with: apt-get install -y libnss-wrapper (or run `make system-deps` as root)"
PROBE_NAME = "phalanx-preflight.devnode.svc.cluster.local"
PROBE_IP = "127.0.0.1"
_RESOLVE = "import socket, sys; print(socket.gethostbyname(sys.argv[1]))"


class PreflightError(RuntimeError):
    """The dev node cannot run pods here; the message names what is missing and the fix."""


def default_nss_wrapper() -> str:
    """Debian's multiarch location of the library (`x86_64-linux-gnu`, `aarch64-linux-gnu`, ...)."""
    return f"/usr/lib/{platform.machine()}-linux-gnu/libnss_wrapper.so"


def probe_environment(nss_wrapper: str, hosts_file: Path) -> dict[str, str]:
    """A pod's resolver set-up, built by the same function the agent uses for pods."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_PRELOAD": nss_wrapper,
        **resolver_env(hosts_file, "phalanx-preflight"),
    }


def check_name_resolution(nss_wrapper: str, python: str, timeout: float = 30.0) -> None:
    """Raises PreflightError unless a child process set up like a pod resolves a cluster-style name."""
    if not Path(nss_wrapper).is_file():
        raise PreflightError(
            f"dev node: {nss_wrapper} is missing, so pods could not resolve each other's names; {INSTALL_HINT}"
        )
    with tempfile.TemporaryDirectory(prefix="phalanx-preflight-") as scratch:
        hosts = Path(scratch) / "hosts"
        hosts.write_text(f"{PROBE_IP} {PROBE_NAME}\n")
        try:
            result = subprocess.run(
                [python, "-c", _RESOLVE, PROBE_NAME],
                env=probe_environment(nss_wrapper, hosts),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise PreflightError(f"dev node: resolving a pod name through {nss_wrapper} hung") from exc
    if result.returncode != 0 or result.stdout.strip() != PROBE_IP:
        detail = (result.stderr.strip().splitlines() or ["no address"])[-1]
        raise PreflightError(
            f"dev node: a pod name does not resolve through {nss_wrapper} ({detail}); "
            f"the library is broken or not nss_wrapper; {INSTALL_HINT}"
        )
