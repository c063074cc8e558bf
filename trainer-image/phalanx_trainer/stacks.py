"""Stacks on demand: `kill -USR1 <pid>` writes every thread's Python stack to stderr (the pod's log)
and the process goes on. When a gang hangs, that shows what each rank waits in (a collective, the
checkpoint writer, the data) without stopping it. A launcher passes the signal to its workers one at
a time, each dump under a line naming its local rank and pid: their stacks are the ones that tell,
the pod's PID 1 is the launcher, and dumps written at once would interleave line by line."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Final

STACK_DUMP_SIGNAL: Final = signal.SIGUSR1
STDERR_FD: Final = 2
# Between two workers' dumps: one is a few milliseconds of writes, even with dozens of threads.
STAGGER_SECONDS: Final = 0.3


def dump_stacks_on_signal() -> None:
    """This process writes its threads' stacks on the signal (C-level: it works while the
    interpreter is stuck in a call that holds the GIL), to file descriptor 2 whatever sys.stderr
    was replaced by. Then the signal is let through: a launcher starts its workers with it blocked,
    since until here its default action would kill them."""
    faulthandler.register(STACK_DUMP_SIGNAL, file=STDERR_FD, all_threads=True, chain=False)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {STACK_DUMP_SIGNAL})


@contextlib.contextmanager
def held_while_starting_workers() -> Iterator[None]:
    """A launcher starts (spawns or forks) its workers inside this: they begin with the signal blocked
    (the mask survives fork and exec) and unblock it once they can dump; one that arrives meanwhile
    waits for that. A forked child never runs the launcher's forwarding either."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {STACK_DUMP_SIGNAL})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {STACK_DUMP_SIGNAL})


def _say(line: str) -> None:
    # os.write, not print: a handler may run in the middle of the main thread's own print.
    os.write(STDERR_FD, f"phalanx-trainer: {line}\n".encode())


def forward_stack_dumps(workers: Callable[[], Iterable[tuple[int, int]]]) -> None:
    """A launcher: the signal goes on to its live workers ((local rank, pid) pairs), one after the
    other, instead of dumping its own loop. The launcher's loop waits STAGGER_SECONDS per worker."""
    busy = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal busy
        if busy:
            return  # a second signal during the round: the round under way answers it
        busy = True
        try:
            live = list(workers())
            if not live:
                _say("stacks: no worker runs now")
            for local_rank, pid in live:
                _say(f"stacks of local rank {local_rank} (pid {pid}):")
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    continue  # exited since it was listed
                time.sleep(STAGGER_SECONDS)  # its dump is written before the next one starts
        finally:
            busy = False

    faulthandler.unregister(STACK_DUMP_SIGNAL)
    signal.signal(STACK_DUMP_SIGNAL, forward)
