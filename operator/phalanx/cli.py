"""`phalanx` command line: `phalanx operator` (what the image runs) and `phalanx dev up|down|status`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from phalanx.devcluster.kueue import KueueSettings


def _dev(args: argparse.Namespace) -> int:
    from phalanx.devcluster.cluster import ClusterError, LocalCluster, default_state_dir
    from phalanx.devcluster.nodes import DEFAULT_POOLS, pools_from_config

    cluster = LocalCluster(Path(args.state_dir) if args.state_dir else default_state_dir(args.name))
    try:
        if args.dev_command == "up":
            pools = DEFAULT_POOLS
            if args.nodes:
                pools = tuple(pools_from_config(yaml.safe_load(Path(args.nodes).read_text()) or []))
            started = time.monotonic()
            kueue = _kueue_settings(args)
            kubeconfig = cluster.up(pools, real_nodes=args.real_nodes, kueue=kueue or False)
            print(f"Local cluster up in {time.monotonic() - started:.1f}s.", file=sys.stderr)
            print(f"  kubectl --kubeconfig {kubeconfig} get nodes", file=sys.stderr)
            print(kubeconfig)
        elif args.dev_command == "down":
            cluster.down()
        else:
            print(json.dumps(cluster.status(), indent=2))
    except ClusterError as exc:
        print(f"phalanx dev {args.dev_command}: {exc}", file=sys.stderr)
        return 1
    return 0


def _kueue_settings(args: argparse.Namespace) -> KueueSettings | None:
    """`dev up --kueue [--kueue-wait-for-pods-ready SECONDS]` as KueueSettings (None without --kueue)."""
    from phalanx.devcluster.kueue import KueueSettings, WaitForPodsReady

    ready = args.kueue_wait_for_pods_ready
    if ready is not None and not args.kueue:
        raise SystemExit("phalanx dev up: --kueue-wait-for-pods-ready needs --kueue")
    if not args.kueue:
        return None
    try:
        return KueueSettings(
            wait_for_pods_ready=None if ready is None else WaitForPodsReady(timeout_seconds=ready)
        )
    except ValueError as exc:
        raise SystemExit(f"phalanx dev up: --kueue-wait-for-pods-ready: {exc}") from exc


MIN_LEASE_SECONDS = 6


def _operator(args: argparse.Namespace) -> int:
    from phalanx.runner import run_operator
    from phalanx.settings import LeaderElection, OperatorSettings

    if args.leader_elect and args.lease_duration_seconds < MIN_LEASE_SECONDS:
        print(f"phalanx operator: --lease-duration-seconds must be at least {MIN_LEASE_SECONDS} "
              "(renewals every 2 s need room before the deadline)", file=sys.stderr)  # fmt: skip
        return 2
    election = LeaderElection(enabled=args.leader_elect, lease_name=args.leader_election_id,
                              lease_duration_seconds=args.lease_duration_seconds)  # fmt: skip
    if args.leader_election_namespace:
        election = dataclasses.replace(election, namespace=args.leader_election_namespace)
    try:
        settings = OperatorSettings.from_environment(
            namespaces=tuple(args.namespace or ()),
            leader_election=election,
            allow_host_path_checkpoints=args.allow_host_path_checkpoints,
        )
    except ValueError as exc:
        print(f"phalanx operator: {exc}", file=sys.stderr)
        return 2
    run_operator(
        settings,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        verbose=args.verbose,
        metrics_bind_address=args.metrics_bind_address,
        health_bind_address=args.health_bind_address,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phalanx", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    op = sub.add_parser("operator", help="run the TrainingJob operator against the current kubeconfig")
    op.add_argument("--namespace", action="append", help="watch this namespace (repeatable; default: all)")
    op.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port (0: off)")
    op.add_argument(
        "--health-port",
        type=int,
        default=8081,
        help="port of /healthz (liveness) and /readyz (readiness); 0: off",
    )
    op.add_argument(
        "--metrics-bind-address",
        default="0.0.0.0",
        help="address /metrics listens on (127.0.0.1: behind a proxy)",
    )
    op.add_argument("--health-bind-address", default="0.0.0.0", help="address /healthz and /readyz listen on")
    op.add_argument("--verbose", action="store_true")
    op.add_argument(
        "--leader-elect", action=argparse.BooleanOptionalAction, default=True,
        help="hold a coordination.k8s.io Lease before writing; others stand by with warm caches (default: on)",
    )  # fmt: skip
    op.add_argument(
        "--leader-election-namespace", help="the Lease's namespace (default: $POD_NAMESPACE or default)"
    )
    op.add_argument("--leader-election-id", default="phalanx-operator", help="the Lease's name")
    op.add_argument(
        "--lease-duration-seconds", type=int, default=15,
        help="a standby takes over this long after the leader's last renewal (renewals every 2 s)",
    )  # fmt: skip
    op.add_argument(
        "--allow-host-path-checkpoints", action=argparse.BooleanOptionalAction, default=False,
        help="create pods whose spec.checkpoint.volume is a hostPath (single-node development; default: refused)",
    )  # fmt: skip
    op.set_defaults(func=_operator)

    dev = sub.add_parser("dev", help="a local control plane for development and tests")
    dev.add_argument("dev_command", choices=("up", "down", "status"))
    dev.add_argument("--name", default="default", help="cluster name (state in ~/.local/state/phalanx/NAME)")
    dev.add_argument("--state-dir", help="state directory (overrides --name)")
    dev.add_argument("--nodes", help="YAML list of simulated node pools (see docs/dev-cluster.md)")
    dev.add_argument(
        "--real-nodes", type=int, default=0,
        help="also start N development nodes that run pods as local processes (docs/dev-node.md)",
    )  # fmt: skip
    dev.add_argument(
        "--kueue", action="store_true",
        help="also run a real Kueue (built by `make kueue-bin`) with its webhooks (docs/dev-cluster.md)",
    )  # fmt: skip
    dev.add_argument(
        "--kueue-wait-for-pods-ready", type=int, metavar="SECONDS",
        help="with --kueue: turn on Kueue's waitForPodsReady with this timeout",
    )  # fmt: skip
    dev.set_defaults(func=_dev)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
