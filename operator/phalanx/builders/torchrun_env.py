"""torchrun's elastic agent settings for a bring-your-own trainer (pure; docs/torchrun.md).

Caller: builders/pods.py merges `elastic_env(...)` over the contract env of a pod whose job restarts
in place, so that a plain `torchrun script.py` (no flags) re-forms its gang when one pod is replaced.

torchrun reads every flag from `PET_<FLAG>`. The contract already sets PET_NNODES, PET_NPROC_PER_NODE,
PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT, which give torchrun's default static rendezvous:
it cannot take a replacement agent in, so a lost pod ends the run. The c10d rendezvous can: the
surviving agents stop their workers, wait in the rendezvous for the replacement agent and start a
new round with it. Group ranks then come from the sorted agent addresses, not from PET_NODE_RANK
(which c10d ignores), hence PET_LOCAL_ADDR: each pod keeps its own name and so its group rank, and
pod 0's name sorts first, so pod 0 stays group rank 0 and keeps hosting the workers' store.
"""

from __future__ import annotations

from phalanx import constants as c


def elastic_env(
    replicas: int,
    procs_per_replica: int,
    master_addr: str,
    port: int,
    job_uid: str,
    max_restarts: int,
    *,
    replica_index: int,
    local_addr: str | None = None,
    join_timeout_seconds: int | None = None,
) -> dict[str, str]:
    """The PET_* variables that turn torchrun's agent elastic, for the pod of `replica_index`.

    `master_addr:port` is pod 0's stable name and the rendezvous port (the contract's
    MASTER_ADDR/MASTER_PORT): pod 0's agent hosts the rendezvous store there. `job_uid` names the
    rendezvous, so agents of another job that reach the same address never join it. `max_restarts`
    is each agent's budget of worker restarts over the pod's life; when it is spent the agent exits
    with the workers' failure and the operator's full gang restart takes over. `local_addr` is this
    pod's own DNS name (builders/names.worker_fqdn). `join_timeout_seconds` bounds how long the
    survivors wait for a replacement before they give up (torch's default: 600 s).
    """
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    if procs_per_replica < 1:
        raise ValueError(f"procs_per_replica must be at least 1, got {procs_per_replica}")
    if not 0 <= replica_index < replicas:
        raise ValueError(f"replica_index must be in 0..{replicas - 1}, got {replica_index}")
    if not 0 < port < 2**16:
        raise ValueError(f"port must be in 1..65535, got {port}")
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be 0 or more, got {max_restarts}")
    if not master_addr or not job_uid:
        raise ValueError("master_addr and job_uid must not be empty")
    if join_timeout_seconds is not None and join_timeout_seconds < 1:
        raise ValueError(f"join_timeout_seconds must be at least 1, got {join_timeout_seconds}")

    conf = {
        # Say who hosts the store instead of letting torch guess from hostnames and addresses: the
        # endpoint is a Service name, and pods that share one host (the dev node) would all try to.
        "is_host": "true" if replica_index == 0 else "false",
        "keep_alive_interval": str(c.TORCHRUN_KEEP_ALIVE_INTERVAL_SECONDS),
        "keep_alive_max_attempt": str(c.TORCHRUN_KEEP_ALIVE_MAX_ATTEMPTS),
    }
    if join_timeout_seconds is not None:
        conf["join_timeout"] = str(join_timeout_seconds)
    env = {
        c.ENV_PET_RDZV_BACKEND: c.TORCHRUN_RDZV_BACKEND,
        c.ENV_PET_RDZV_ENDPOINT: f"{master_addr}:{port}",
        c.ENV_PET_RDZV_ID: job_uid,
        c.ENV_PET_RDZV_CONF: ",".join(f"{key}={value}" for key, value in conf.items()),
        c.ENV_PET_MAX_RESTARTS: str(max_restarts),
        # A fixed gang size: in-place restart keeps WORLD_SIZE, it never shrinks the job.
        c.ENV_PET_NNODES: f"{replicas}:{replicas}",
        c.ENV_PET_NPROC_PER_NODE: str(procs_per_replica),
        # Restarted workers must not meet the previous generation's keys (constants.py says why).
        c.ENV_TORCH_DISABLE_SHARED_RDZV_STORE: "1",
    }
    if local_addr:
        env[c.ENV_PET_LOCAL_ADDR] = local_addr
    return env
