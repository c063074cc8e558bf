"""Stacks on demand: `kill -USR1 <pid>` writes every thread's Python stack to stderr (the pod's log)
and the process goes on. When a gang hangs, that shows what each rank waits in (a collective, the
checkpoint writer, the data) without stopping it. A launcher passes the signal to its workers: their
stacks are the ones that tell, and the pod's PID 1 is the launcher."""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Final

STACK_DUMP_SIGNAL: Final = signal.SIGUSR1
STDERR_FD: Final = 2


def dump_stacks_on_signal() -> None:
    """This process writes its threads' stacks on the signal (C-level: it works while the
    interpreter is stuck in a call that holds the GIL). To file descriptor 2, whatever sys.stderr
    was replaced by."""
    faulthandler.register(STACK_DUMP_SIGNAL, file=STDERR_FD, all_threads=True, chain=False)


def forward_stack_dumps(worker_pids: Callable[[], Iterable[int]]) -> None:
    """A launcher: the signal goes on to its live workers instead of dumping its own loop."""

    def forward(signum: int, frame: FrameType | None) -> None:
        for pid in worker_pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass  # exited since it was listed

    faulthandler.unregister(STACK_DUMP_SIGNAL)
    signal.signal(STACK_DUMP_SIGNAL, forward)
