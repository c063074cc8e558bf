"""One background writer thread, at most one job in flight, errors handed back to the caller."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class BackgroundWriter:
    """Runs a job on its own thread. The thread lowers its own CPU priority so that training, which
    shares the cores, keeps its pace: the write path is mostly syscalls and hashing (both release the
    GIL), so what remains to fight over is CPU time, and the scheduler settles that by priority."""

    def __init__(self, nice_increment: int = 10) -> None:
        self._nice_increment = nice_increment
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, job: Callable[[], None], name: str) -> None:
        if self._thread is not None:
            raise RuntimeError("a checkpoint write is still in flight; wait() first")
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(job,), name=name, daemon=False)
        self._thread.start()

    def _run(self, job: Callable[[], None]) -> None:
        if self._nice_increment > 0:
            try:  # on Linux a thread id is a valid PRIO_PROCESS target and affects only this thread
                current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), current + self._nice_increment)
            except OSError as error:
                log.debug("could not lower the writer thread's priority: %s", error)
        try:
            job()
        except BaseException as error:  # handed to the caller of wait()
            self._error = error

    def wait(self) -> BaseException | None:
        """Block until the job in flight (if any) ends; returns its exception, if it raised one."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        return error
