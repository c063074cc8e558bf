"""A rank told its restart generation early finds the store of the generation before, which goes
away as that generation's rank 0 stops: it waits for its own generation's store, never fails.

From a whole-suite run: a warm spare POSTed generation 1 connected to rank 0's generation-0 store
while rank 0 was still saving; the store closed under its `get`, the spare's workers exited as if
a peer were lost, and generation 1 never formed (a full restart two minutes later)."""

from __future__ import annotations

import datetime
import socket
import threading
import time
from typing import Any

import pytest
from torch._C._distributed_c10d import PrefixStore, TCPStore

from phalanx_trainer.distenv import DistEnv
from phalanx_trainer.generation import GENERATION_KEY, generation_prefix, open_generation_store

pytestmark = pytest.mark.trainer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def host(port: int) -> TCPStore:
    return TCPStore("127.0.0.1", port, 2, is_master=True, timeout=datetime.timedelta(seconds=30),
                    wait_for_workers=False)  # fmt: skip


def test_a_rank_waiting_on_the_old_generations_store_survives_it_going_away() -> None:
    port = free_port()
    old = host(port)  # generation 0's rank 0 set no key yet for 1: the waiting rank blocks in get()
    env = DistEnv(1, 0, 2, 2, 1, 1, "127.0.0.1", port, 1, 30.0, restart_in_place=True, generation=1)
    outcome: dict[str, Any] = {}

    def join() -> None:
        try:
            outcome["store"] = open_generation_store(env, log=lambda line: None)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            outcome["error"] = error

    joining = threading.Thread(target=join, daemon=True)
    joining.start()
    time.sleep(0.5)  # blocked in get() on the old store
    del old  # generation 0's rank 0 exits: its store closes under the waiting rank
    time.sleep(0.3)
    new = host(port)  # generation 1's rank 0
    new.set(GENERATION_KEY, "1")
    PrefixStore(generation_prefix(1), new).add("arrived", 1)
    joining.join(timeout=20)
    assert "error" not in outcome, f"the waiting rank failed: {outcome.get('error')!r}"
    assert "store" in outcome, "the waiting rank never joined generation 1"
