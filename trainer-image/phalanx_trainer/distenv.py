"""Reads the operator's environment contract (docs/environment.md) and waits for the rendezvous."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from phalanx_trainer import contract


class RendezvousTimeout(Exception):
    pass


class EnvError(Exception):
    pass


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    attempt: int
    rendezvous_timeout: float
    # Restart in place: the group is built per restart generation, fenced (generation.py).
    restart_in_place: bool = False
    generation: int = 0
    collective_timeout: float | None = None  # seconds; None keeps torch's default

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def process_group_backend(use_cuda: bool) -> str:
    """The torch.distributed backend: NCCL for CUDA tensors plus gloo for the CPU ones the trainer
    also reduces (the step's loss in Trainer.reduce_loss); an NCCL-only group fails on those."""
    return "cpu:gloo,cuda:nccl" if use_cuda else "gloo"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"environment {name}={raw!r}: expected an integer") from None


def flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise EnvError(f"environment {name}={env[name]!r}: expected true or false")


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise EnvError(f"environment {name}={raw!r}: expected seconds") from None
    if value <= 0:
        raise EnvError(f"environment {name}={raw!r}: expected a positive number of seconds")
    return value


def read_dist_env(env: Mapping[str, str]) -> DistEnv:
    """The process's place in the job; with no variables at all, a single process of world size 1."""
    nnodes = _int(env, contract.ENV_NNODES, 1)
    nproc = _int(env, contract.ENV_NPROC_PER_NODE, 1)
    node_rank = _int(env, contract.ENV_NODE_RANK, 0)
    local_rank = _int(env, contract.ENV_LOCAL_RANK, 0)
    world_size = _int(env, contract.ENV_WORLD_SIZE, nnodes * nproc)
    rank = _int(env, contract.ENV_RANK, node_rank * nproc + local_rank)
    timeout_raw = env.get(contract.ENV_RENDEZVOUS_TIMEOUT, "")
    try:
        timeout = float(timeout_raw) if timeout_raw else contract.DEFAULT_RENDEZVOUS_TIMEOUT_SECONDS
    except ValueError:
        raise EnvError(
            f"environment {contract.ENV_RENDEZVOUS_TIMEOUT}={timeout_raw!r}: expected seconds"
        ) from None
    if not 0 <= rank < world_size:
        raise EnvError(f"RANK={rank} is outside WORLD_SIZE={world_size}")
    in_place = flag(env, contract.ENV_RESTART_IN_PLACE)
    collective_timeout: float | None = None
    if in_place or env.get(contract.ENV_COLLECTIVE_TIMEOUT):
        collective_timeout = _seconds(
            env, contract.ENV_COLLECTIVE_TIMEOUT, contract.DEFAULT_COLLECTIVE_TIMEOUT_SECONDS
        )
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=nproc,
        master_addr=env.get(contract.ENV_MASTER_ADDR, "127.0.0.1"),
        master_port=_int(env, contract.ENV_MASTER_PORT, 29500),
        attempt=_int(env, contract.ENV_ATTEMPT, 0),
        rendezvous_timeout=timeout,
        restart_in_place=in_place,
        generation=_int(env, contract.ENV_GENERATION, 0),
        collective_timeout=collective_timeout,
    )


def needs_local_launch(env: Mapping[str, str]) -> bool:
    """True when this process should spawn NPROC_PER_NODE workers (torchrun already sets RANK)."""
    return (
        _int(env, contract.ENV_NPROC_PER_NODE, 1) > 1
        and contract.ENV_RANK not in env
        and contract.ENV_LOCAL_RANK not in env
    )


def needs_resident_launch(env: Mapping[str, str]) -> bool:
    """True for the pod's resident launcher (restart in place), whatever NPROC_PER_NODE is."""
    return (
        flag(env, contract.ENV_RESTART_IN_PLACE)
        and contract.ENV_RANK not in env
        and contract.ENV_LOCAL_RANK not in env
    )


def worker_env(env: Mapping[str, str], local_rank: int) -> dict[str, str]:
    nproc = _int(env, contract.ENV_NPROC_PER_NODE, 1)
    node_rank = _int(env, contract.ENV_NODE_RANK, 0)
    nnodes = _int(env, contract.ENV_NNODES, 1)
    return {
        **env,
        contract.ENV_RANK: str(node_rank * nproc + local_rank),
        contract.ENV_LOCAL_RANK: str(local_rank),
        contract.ENV_WORLD_SIZE: env.get(contract.ENV_WORLD_SIZE) or str(nnodes * nproc),
    }


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except OSError:
        return False


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


# A restart's wait is short (the peer's store is a fork and an import away), a cold start's long (DNS,
# an image pull): poll often for the first seconds, then every half second.
FAST_POLL_SECONDS = 0.05
FAST_POLL_FOR_SECONDS = 5.0
SLOW_POLL_SECONDS = 0.5


def poll_interval(waited: float) -> float:
    return FAST_POLL_SECONDS if waited < FAST_POLL_FOR_SECONDS else SLOW_POLL_SECONDS


def wait_for_rendezvous(
    dist_env: DistEnv,
    log: Callable[[str], None],
    resolves: Callable[[str], bool] = _resolves,
    accepts: Callable[[str, int], bool] = _accepts,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log_every: float = 10.0,
) -> None:
    """Blocks until MASTER_ADDR resolves and (ranks != 0) MASTER_PORT accepts, or times out."""
    began = clock()
    last_log = began
    addr, port = dist_env.master_addr, dist_env.master_port
    while True:
        resolved = resolves(addr)
        if resolved and (dist_env.rank == 0 or accepts(addr, port)):
            return
        now = clock()
        waiting_for = f"{addr} to resolve" if not resolved else f"{addr}:{port} to accept connections"
        if now - began >= dist_env.rendezvous_timeout:
            raise RendezvousTimeout(
                f"rendezvous timed out after {dist_env.rendezvous_timeout:.0f} s waiting for {waiting_for} "
                f"(rank {dist_env.rank} of {dist_env.world_size}; "
                f"set {contract.ENV_RENDEZVOUS_TIMEOUT} to wait longer)"
            )
        if now - last_log >= log_every:
            log(f"waiting for {waiting_for} ({now - began:.0f} s of {dist_env.rendezvous_timeout:.0f} s)")
            last_log = now
        sleep(poll_interval(now - began))
