"""The pool of writer threads that pod creations, gate lifts and Events share (I/O side; the order
is policy/write_order.py). Its threads always take the pending write that policy ranks first, so a
gang's writes go out together, several in flight at once, and gangs go in admission order."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from phalanx.policy.write_order import BACKGROUND, GangRank, PendingWrite, write_sort_key

T = TypeVar("T")
R = TypeVar("R")


@dataclass(order=True)
class _Queued:
    sort_key: tuple[GangRank, int]
    future: Future[Any] = field(compare=False)
    call: Callable[[], Any] = field(compare=False)


class GangWritePool:
    def __init__(self, threads: int, thread_name_prefix: str = "writes") -> None:
        self._heap: list[_Queued] = []
        self._seq = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{thread_name_prefix}_{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., R], *args: Any, rank: GangRank = BACKGROUND) -> Future[R]:
        """Queues fn(*args) under the gang's rank (Events and other bookkeeping: BACKGROUND)."""
        future: Future[R] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("cannot submit a write after shutdown")
            write = PendingWrite(rank, next(self._seq))
            heapq.heappush(self._heap, _Queued(write_sort_key(write), future, lambda: fn(*args)))
            self._ready.notify()
        return future

    def map(self, fn: Callable[[T], R], items: Iterable[T], rank: GangRank = BACKGROUND) -> list[R]:
        """fn over items, one gang's writes queued together under its rank; returns in item order
        once all have answered (the first failure is raised)."""
        futures = [self.submit(fn, item, rank=rank) for item in items]
        return [f.result() for f in futures]

    def pending(self) -> int:
        with self._ready:
            return len(self._heap)

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._heap and not self._closed:
                    self._ready.wait()
                if not self._heap:
                    return  # shut down and drained
                queued = heapq.heappop(self._heap)
            if not queued.future.set_running_or_notify_cancel():
                continue
            try:
                queued.future.set_result(queued.call())
            except BaseException as exc:  # the caller waiting on the future sees it
                queued.future.set_exception(exc)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """As ThreadPoolExecutor's: no new writes; cancel_futures cancels those not started yet."""
        with self._ready:
            self._closed = True
            if cancel_futures:
                for queued in self._heap:
                    queued.future.cancel()
                self._heap.clear()
            self._ready.notify_all()
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()
