"""`python -m phalanx.devnode --kubeconfig K --name N` runs the agent; `... logs NS POD` prints a log."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from phalanx.devnode.network import default_ip_prefix

PREFLIGHT_FAILED = 3  # exit code: the node cannot run pods here and did not register


def default_state_dir(node_name: str) -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "phalanx-devnode" / node_name


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_run_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m phalanx.devnode",
        description="A development node: registers a Node and runs the pods bound to it as local processes. "
        "`python -m phalanx.devnode logs NAMESPACE POD` prints a container's log.",
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--name", required=True, help="the Node's name")
    parser.add_argument("--state-dir", type=Path, help="default: ~/.local/state/phalanx-devnode/<name>")
    parser.add_argument("--cpu", default=str(os.cpu_count() or 1), help="advertised CPU capacity")
    parser.add_argument("--memory", default=f"{_memory_bytes() // (1 << 20)}Mi", help="advertised memory")
    parser.add_argument("--pods", type=int, default=32)
    parser.add_argument("--gpus", type=int, default=0, help="advertised nvidia.com/gpu (nothing is checked)")
    parser.add_argument(
        "--ip-prefix", help="pods get <prefix>.2 .. .254; default: derived from the state dir"
    )
    parser.add_argument(
        "--workdir", default=os.getcwd(), help="working directory of containers that set none"
    )
    parser.add_argument(
        "--nss-wrapper",
        help="libnss_wrapper.so that pods preload to resolve cluster names (default: Debian's)",
    )
    return parser.parse_args(argv)


def parse_logs_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m phalanx.devnode logs")
    parser.add_argument("namespace")
    parser.add_argument("pod")
    parser.add_argument("--container", default="", help="default: every container of the pod")
    parser.add_argument("--name", default="", help="the node (for its default state dir)")
    parser.add_argument("--state-dir", type=Path, help="the agent's state dir (default: search them all)")
    return parser.parse_args(argv)


def find_logs(state_dirs: Sequence[Path], namespace: str, pod: str, container: str) -> list[Path]:
    pattern = f"{namespace}_{pod}_{container or '*'}.log"
    return sorted(path for state_dir in state_dirs for path in (state_dir / "logs").glob(pattern))


def show_logs(argv: Sequence[str]) -> int:
    args = parse_logs_args(argv)
    if args.state_dir:
        state_dirs = [args.state_dir]
    elif args.name:
        state_dirs = [default_state_dir(args.name)]
    else:
        state_dirs = sorted(default_state_dir("x").parent.glob("*"))
    paths = find_logs(state_dirs, args.namespace, args.pod, args.container)
    if not paths:
        print(
            f"no log for pod {args.namespace}/{args.pod} under {[str(d) for d in state_dirs]}",
            file=sys.stderr,
        )
        return 1
    for path in paths:
        if len(paths) > 1:
            print(f"==> {path.name} <==")
        sys.stdout.write(path.read_text(errors="replace"))
    return 0


def run_agent(argv: Sequence[str]) -> int:
    from kubernetes import config

    from phalanx.devnode.agent import Agent, AgentConfig
    from phalanx.devnode.node import NodeShape
    from phalanx.devnode.preflight import PreflightError, default_nss_wrapper

    args = parse_run_args(argv)
    state_dir = (args.state_dir or default_state_dir(args.name)).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    agent_config = AgentConfig(
        shape=NodeShape(args.name, args.cpu, args.memory, args.pods, args.gpus),
        state_dir=state_dir,
        ip_prefix=args.ip_prefix or default_ip_prefix(f"{state_dir}:{args.name}"),
        default_workdir=str(Path(args.workdir).resolve()),
        nss_wrapper=args.nss_wrapper or default_nss_wrapper(),
    )
    api_client = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    agent = Agent(api_client, agent_config)

    def stop(signum: int, frame: FrameType | None) -> None:
        agent.stopping.set()
        agent.wake.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        agent.run()
    except PreflightError as exc:
        print(exc, file=sys.stderr, flush=True)
        return PREFLIGHT_FAILED
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "logs":
        return show_logs(args[1:])
    return run_agent(args)


if __name__ == "__main__":
    sys.exit(main())
