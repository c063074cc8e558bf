"""Joining one restart generation's process group, fenced so an older generation can never join.

Three fences, each with its own clear failure:
1. Rank 0 (the store host) publishes its generation under `phalanx/generation` in the TCPStore; any
   other rank reads it first. A worker older than the store stops with StaleGeneration (exit 76);
   one newer than the store (an old store host not yet gone) waits for the new host.
2. Every key of the group lives under a per-generation PrefixStore, `phalanx/gen-<N>/`: ranks of
   different generations never meet on a key even if fence 1 were skipped.
3. After init_process_group, all ranks all-reduce their generation (max and min) and abort on a
   mismatch.

A per-generation arrival barrier on the store (with the long rendezvous timeout) comes before the
group is built, so the short collective timeout applies to collectives only and not to the wait
for a replacement pod to be scheduled.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from phalanx_trainer.distenv import DistEnv, poll_interval

GENERATION_KEY = "phalanx/generation"


class StaleGeneration(Exception):
    """This worker belongs to an older generation than the group it tried to join."""


def generation_prefix(generation: int) -> str:
    return f"phalanx/gen-{generation}"


def _connect(dist_env: DistEnv, timeout: float) -> TCPStore:
    return TCPStore(
        dist_env.master_addr,
        dist_env.master_port,
        dist_env.world_size,
        is_master=dist_env.rank == 0,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
    )


def open_generation_store(
    dist_env: DistEnv,
    log: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> Store:
    """The store of this worker's generation (fences 1 and 2), after every rank has arrived."""
    began = clock()
    deadline = began + dist_env.rendezvous_timeout
    generation = dist_env.generation
    logged_at: float | None = None
    while True:
        if dist_env.rank == 0:
            store = _connect(dist_env, max(1.0, deadline - clock()))
            store.set(GENERATION_KEY, str(generation))
            break
        try:
            store = _connect(dist_env, max(1.0, deadline - clock()))
            published = int(store.get(GENERATION_KEY))
        except dist.DistError as error:
            # The store of the generation before, going away as its rank 0 stops (a spare or a
            # re-forked rank told the generation early finds it still up): not a lost peer, yet.
            if clock() >= deadline:
                raise
            if logged_at is None or clock() - logged_at >= 10.0:
                log(
                    f"store host closed the connection ({type(error).__name__}); waiting for generation {generation}"
                )
                logged_at = clock()
            time.sleep(poll_interval(clock() - began))
            continue
        if published == generation:
            break
        if published > generation:
            raise StaleGeneration(
                f"rank {dist_env.rank} is of restart generation {generation} but the group at "
                f"{dist_env.master_addr}:{dist_env.master_port} is at generation {published}: "
                "a stale worker never joins a newer generation"
            )
        if clock() >= deadline:
            raise StaleGeneration(
                f"rank {dist_env.rank} of generation {generation} found only generation {published} "
                f"at {dist_env.master_addr}:{dist_env.master_port} for {dist_env.rendezvous_timeout:.0f} s"
            )
        if logged_at is None or clock() - logged_at >= 10.0:  # polled often at first: said once per 10 s
            log(f"store host is still at generation {published}; waiting for generation {generation}")
            logged_at = clock()
        del store
        time.sleep(poll_interval(clock() - began))
    prefixed = PrefixStore(generation_prefix(generation), store)
    _wait_for_everyone(prefixed, dist_env, deadline, clock)
    return prefixed


def _wait_for_everyone(store: Store, dist_env: DistEnv, deadline: float, clock: Callable[[], float]) -> None:
    arrived = store.add("arrived", 1)
    while arrived < dist_env.world_size:
        if clock() >= deadline:
            raise TimeoutError(
                f"generation {dist_env.generation}: {arrived} of {dist_env.world_size} ranks arrived "
                f"within {dist_env.rendezvous_timeout:.0f} s"
            )
        time.sleep(0.05)
        arrived = store.add("arrived", 0)


def init_generation_group(dist_env: DistEnv, backend: str, log: Callable[[str], None]) -> None:
    """init_process_group on the generation's store, then fence 3."""
    store = open_generation_store(dist_env, log)
    timeout = dist_env.collective_timeout
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=dist_env.rank,
        world_size=dist_env.world_size,
        timeout=datetime.timedelta(seconds=timeout) if timeout else None,
    )
    check_generation_agreement(dist_env.generation)


def check_generation_agreement(generation: int) -> None:
    """Every rank of the group holds the same generation, or all of them stop here."""
    both = torch.tensor([generation, -generation], dtype=torch.int64)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    highest, lowest = int(both[0]), -int(both[1])
    if highest != lowest:
        raise StaleGeneration(
            f"the process group mixes restart generations {lowest}..{highest}; "
            f"this rank is of generation {generation}: aborting"
        )


# gloo reports a lost peer as a plain RuntimeError from its transport (connection reset or closed,
# or a timeout); NCCL and the store raise torch.distributed.DistError subclasses.
_LOST_PEER_MARKERS = (
    "gloo/transport/",
    "Connection reset by peer",
    "Connection closed by peer",
    "Timed out waiting",
)


def lost_peer(err: BaseException) -> bool:
    """Whether an exception out of a generation (group, Trainer build, training, close) means the
    generation broke, not that the code did: the one classifier for 76 versus 1."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(err, CheckpointException):
        # DCP gathers every rank's failure into one BaseException; any lost peer among them wins.
        return any(lost_peer(failure) for failure, _ in err.failures.values())
    if isinstance(err, StaleGeneration | dist.DistError | ConnectionError | TimeoutError):
        return True
    return isinstance(err, RuntimeError) and any(marker in str(err) for marker in _LOST_PEER_MARKERS)
