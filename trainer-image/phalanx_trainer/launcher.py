"""The local launcher: NPROC_PER_NODE worker processes in one pod, SIGTERM forwarded, one exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from phalanx_trainer import contract
from phalanx_trainer.distenv import worker_env
from phalanx_trainer.restart_policy import combine_exit_codes
from phalanx_trainer.stacks import forward_stack_dumps, held_while_starting_workers

FAILURE_GRACE_SECONDS = 30.0  # after one worker fails, how long the others get to stop by themselves


def as_exit_code(returncode: int) -> int:
    """Popen reports death by signal N as -N; a shell would say 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def launch_local_workers(argv: Sequence[str], env: Mapping[str, str], nproc: int) -> int:
    with held_while_starting_workers():
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "phalanx_trainer", *argv], env=worker_env(env, local_rank)
            )
            for local_rank in range(nproc)
        ]

    def forward(signum: int, frame: FrameType | None) -> None:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    forward_stack_dumps(lambda: [(rank, w.pid) for rank, w in enumerate(workers) if w.returncode is None])

    codes: list[int | None] = [None] * nproc
    failed_at: float | None = None
    while any(code is None for code in codes):
        for index, worker in enumerate(workers):
            if codes[index] is None and worker.poll() is not None:
                codes[index] = as_exit_code(worker.returncode)
                if codes[index] not in (0, contract.EXIT_CHECKPOINTED_ON_PREEMPTION) and failed_at is None:
                    failed_at = time.monotonic()
                    # Peers would block in a collective waiting for the dead rank: ask them to stop.
                    forward(signal.SIGTERM, None)
        if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_SECONDS:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
        time.sleep(0.1)
    return combine_exit_codes([code for code in codes if code is not None])


def current_env() -> dict[str, str]:
    return dict(os.environ)
