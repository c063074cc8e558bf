"""Command lines of the control-plane components (pure, so they are unit-tested without a cluster)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from phalanx.devcluster.pki import Pki

SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    controller_manager: int
    kwok: int


@dataclass(frozen=True)
class Component:
    name: str
    argv: tuple[str, ...]


def etcd(bin_dir: Path, data_dir: Path, ports: Ports) -> Component:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return Component(
        "etcd",
        (
            str(bin_dir / "etcd"),
            "--name=phalanx-dev",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=phalanx-dev={peer}",
            # A throw-away development store: durability is not worth the fsync latency here.
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ),
    )


def kube_apiserver(bin_dir: Path, pki: Pki, ports: Ports) -> Component:
    return Component(
        "kube-apiserver",
        (
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--tls-cert-file={pki.server_cert}",
            f"--tls-private-key-file={pki.server_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            # The defaults already include Priority; named so the requirement is visible.
            # OwnerReferencesPermissionEnforcement, as on OpenShift and hardened clusters: setting
            # blockOwnerDeletion needs `update` on the owner's finalizers subresource.
            "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,Priority,DefaultTolerationSeconds,"
            "NodeRestriction,ResourceQuota,LimitRanger,OwnerReferencesPermissionEnforcement",
            "--allow-privileged=true",
            "--max-requests-inflight=800",
            "--max-mutating-requests-inflight=400",
            "--event-ttl=30m",
            "--v=1",
        ),
    )


def kube_scheduler(bin_dir: Path, kubeconfig: Path, ports: Ports) -> Component:
    return Component(
        "kube-scheduler",
        (
            str(bin_dir / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--v=1",
        ),
    )


def kube_controller_manager(bin_dir: Path, kubeconfig: Path, pki: Pki, ports: Ports) -> Component:
    return Component(
        "kube-controller-manager",
        (
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.ca_cert}",
            "--use-service-account-credentials=true",
            f"--cluster-cidr={POD_CIDR}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Every default controller: garbage collector, node lifecycle and taint eviction,
            # pod GC, service accounts, endpoints, ... (the cloud ones are off without a provider).
            "--controllers=*",
            "--node-monitor-grace-period=40s",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--concurrent-gc-syncs=20",
            "--v=1",
        ),
    )


def kwok(bin_dir: Path, kubeconfig: Path, stages: Path, ports: Ports) -> Component:
    return Component(
        "kwok",
        (
            str(bin_dir / "kwok"),
            f"--kubeconfig={kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--cidr=10.0.0.1/16",
            "--node-ip=10.255.0.1",
            "--node-lease-duration-seconds=40",
            "--server-address=127.0.0.1:" + str(ports.kwok),
        ),
    )


# Kueue v0.17 reads its metrics serving cert from this fixed path when its internal cert management
# is off. The manager runs in a private mount namespace whose /etc is an overlay: the real /etc
# below, the state dir's etc_upper (holding kueue/metrics/certs) on top. The host's /etc stays as is.
KUEUE_METRICS_CERT_DIR = "/etc/kueue/metrics/certs"
_OVERLAY_THEN_EXEC = (
    'mount -t overlay phalanx-kueue-etc -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc'
    ' && shift 2 && exec "$@"'
)


def kueue_manager(
    binary: Path, config: Path, kubeconfig: Path, etc_upper: Path, etc_work: Path, as_root: bool
) -> Component:
    for path in (etc_upper, etc_work):
        if any(ch in str(path) for ch in ",:\\"):
            raise ValueError(
                f"state directory {path} holds ',', ':' or '\\': overlayfs options cannot name it"
            )
    # Without root, a user namespace (mapping the caller to root) is what lets mount run.
    namespaces = ("--mount",) if as_root else ("--user", "--map-root-user", "--mount")
    return Component(
        "kueue",
        (
            "unshare", *namespaces, "--propagation", "private",
            "sh", "-c", _OVERLAY_THEN_EXEC, "kueue-etc", str(etc_upper), str(etc_work),
            str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}", "--zap-log-level=info",
        ),
    )  # fmt: skip
