"""Pod addresses on loopback and the hosts file that makes pod DNS names resolve (pure)."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def default_ip_prefix(seed: str) -> str:
    """A /24 inside 127.0.0.0/8 chosen from `seed`, so agents of different clusters rarely overlap."""
    digest = hashlib.sha256(seed.encode()).digest()
    # 127.0.x is left to the usual loopback users; start the second octet at 1.
    return f"127.{1 + digest[0] % 254}.{digest[1]}"


FIRST_HOST, LAST_HOST = 2, 254


@dataclass
class IpPool:
    """Hands out <prefix>.2 .. <prefix>.254, one per pod uid, round robin.

    Round robin rather than lowest-free: a new pod must not inherit the address of one that just
    ended, whose listening ports may still be held by connections in TIME_WAIT (a new c10d store on
    the same address and port would fail with EADDRINUSE).
    """

    prefix: str
    owners: dict[str, str] = field(default_factory=dict)  # ip -> pod uid
    next_host: int = FIRST_HOST

    def __post_init__(self) -> None:
        ipaddress.IPv4Address(f"{self.prefix}.1")  # raises on a malformed prefix

    def allocate(self, uid: str) -> str:
        for ip, owner in self.owners.items():
            if owner == uid:
                return ip
        span = LAST_HOST - FIRST_HOST + 1
        for offset in range(span):
            host = FIRST_HOST + (self.next_host - FIRST_HOST + offset) % span
            ip = f"{self.prefix}.{host}"
            if ip not in self.owners:
                self.owners[ip] = uid
                self.next_host = host + 1
                return ip
        raise RuntimeError(f"no free pod address left in {self.prefix}.0/24")

    def release(self, uid: str) -> None:
        for ip in [ip for ip, owner in self.owners.items() if owner == uid]:
            del self.owners[ip]


@dataclass(frozen=True)
class PodAddress:
    ip: str
    hostname: str
    subdomain: str
    namespace: str


LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


def peer_pod_addresses(pods: Iterable[dict[str, Any]]) -> list[PodAddress]:
    """The running pods of the other dev nodes on this machine (their address is on loopback), so
    that a gang spread over two agents resolves all of its names, as cluster DNS would. Pods of
    simulated nodes have addresses nothing here answers, and a pod being deleted is about to stop
    answering; they are left out."""
    found = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        try:
            on_loopback = ipaddress.IPv4Address(status.get("podIP") or "") in LOOPBACK
        except ValueError:
            on_loopback = False
        deleting = bool(meta.get("deletionTimestamp"))
        if on_loopback and status.get("phase") == "Running" and not deleting:
            hostname = spec.get("hostname") or meta["name"]
            found.append(
                PodAddress(status["podIP"], hostname, spec.get("subdomain") or "", meta["namespace"])
            )
    return found


def pod_names(pod: PodAddress, cluster_domain: str = "cluster.local") -> list[str]:
    """The names a pod answers to, most qualified first, as cluster DNS and /etc/hosts would give them."""
    if not pod.subdomain:
        return [pod.hostname]
    base = f"{pod.hostname}.{pod.subdomain}.{pod.namespace}"
    return [
        f"{base}.svc.{cluster_domain}",
        f"{base}.svc",
        base,
        f"{pod.hostname}.{pod.subdomain}",
        pod.hostname,
    ]


def render_hosts(
    pods: Iterable[PodAddress],
    host_lines: str = "",
    cluster_domain: str = "cluster.local",
    peers: Iterable[PodAddress] = (),
) -> str:
    """An /etc/hosts for nss_wrapper: the machine's own entries, then two lines per pod of this
    agent, then two per pod of the other dev nodes (`peers`). nss_wrapper answers with the first
    matching line, so a short name that two namespaces share (worker-0.job) resolves to this
    agent's pod, as the search path of the pod's own namespace would make it in a cluster.

    The second line carries the IPv4-mapped IPv6 address: c10d's store looks a name up as IPv6 first
    and retries that form instead of falling back to IPv4 when only an IPv4 line exists.
    """
    lines = [line for line in host_lines.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    ordered = sorted(pods, key=_by_name) + sorted(peers, key=_by_name)
    for pod in ordered:
        names = " ".join(pod_names(pod, cluster_domain))
        lines.append(f"{pod.ip} {names}")
        lines.append(f"::ffff:{pod.ip} {names}")
    return "\n".join(lines) + "\n"


def _by_name(pod: PodAddress) -> tuple[str, str, str]:
    return (pod.namespace, pod.hostname, pod.ip)


def resolver_env(hosts_file: Path, hostname: str) -> dict[str, str]:
    """What nss_wrapper reads (the agent preloads the library itself): the pods' hosts file, the
    machine's users and groups, and the pod's own hostname."""
    return {
        "NSS_WRAPPER_HOSTS": str(hosts_file),
        "NSS_WRAPPER_PASSWD": "/etc/passwd",
        "NSS_WRAPPER_GROUP": "/etc/group",
        "NSS_WRAPPER_HOSTNAME": hostname,
    }
