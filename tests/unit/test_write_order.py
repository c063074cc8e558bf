"""policy/write_order.py and the pool that follows it (controller/gang_writes.py): pod writes go
out gang by gang, in admission order, Events after them."""

from __future__ import annotations

import threading

from phalanx.controller.gang_writes import GangWritePool
from phalanx.policy.write_order import BACKGROUND, GangRank, PendingWrite, write_order


def test_writes_group_by_gang_in_admission_order() -> None:
    old, new, urgent = (
        GangRank.of(0, 10.0, "ns/old"),
        GangRank.of(0, 20.0, "ns/new"),
        GangRank.of(5, 30.0, "ns/u"),
    )
    # Asked for interleaved, as reconciles and an admission pass racing for the writers would.
    asked = [
        PendingWrite(new, 0), PendingWrite(BACKGROUND, 1), PendingWrite(old, 2), PendingWrite(new, 3),
        PendingWrite(urgent, 4), PendingWrite(old, 5), PendingWrite(urgent, 6),
    ]  # fmt: skip
    order = write_order(asked)
    assert [(w.rank.key, w.seq) for w in order] == [
        ("ns/u", 4), ("ns/u", 6),  # higher priority first, though created last
        ("ns/old", 2), ("ns/old", 5),  # then the older gang, its writes in the order asked
        ("ns/new", 0), ("ns/new", 3),
        ("", 1),  # the Event after every pod write
    ]  # fmt: skip


def test_equal_priority_and_age_break_ties_by_key_like_admission() -> None:
    a, b = GangRank.of(1, 5.0, "ns/a"), GangRank.of(1, 5.0, "ns/b")
    assert [w.rank.key for w in write_order([PendingWrite(b, 0), PendingWrite(a, 1)])] == ["ns/a", "ns/b"]


def test_pool_serves_the_head_gang_first_whatever_the_submission_order() -> None:
    pool = GangWritePool(1, thread_name_prefix="test-writes")
    gate = threading.Event()
    done: list[str] = []
    try:
        blocker = pool.submit(gate.wait, rank=GangRank.of(0, 0.0, "ns/first"))  # holds the one thread
        futures = [
            pool.submit(done.append, "event"),
            *(pool.submit(done.append, f"new-{i}", rank=GangRank.of(0, 20.0, "ns/new")) for i in range(3)),
            *(pool.submit(done.append, f"old-{i}", rank=GangRank.of(0, 10.0, "ns/old")) for i in range(3)),
        ]
        gate.set()
        blocker.result(timeout=10)
        for future in futures:
            future.result(timeout=10)
    finally:
        pool.shutdown()
    assert done == ["old-0", "old-1", "old-2", "new-0", "new-1", "new-2", "event"]


def test_pool_map_returns_in_item_order_and_raises_the_failure() -> None:
    pool = GangWritePool(4)
    try:
        assert pool.map(lambda x: x * x, range(10), rank=GangRank.of(0, 1.0, "ns/j")) == [
            x * x for x in range(10)
        ]

        def fail(x: int) -> int:
            raise ValueError(f"refused {x}")

        try:
            pool.map(fail, [3])
        except ValueError as exc:
            assert str(exc) == "refused 3"
        else:
            raise AssertionError("the write's failure was swallowed")
    finally:
        pool.shutdown()


def test_shutdown_with_cancel_drops_writes_not_started() -> None:
    pool = GangWritePool(1)
    gate, started = threading.Event(), threading.Event()
    running = pool.submit(lambda: started.set() or gate.wait())
    queued = pool.submit(lambda: "never")
    assert started.wait(timeout=10)
    drainer = threading.Thread(target=pool.shutdown, kwargs={"cancel_futures": True})
    drainer.start()
    gate.set()
    drainer.join(timeout=10)
    assert running.result(timeout=1) is True
    assert queued.cancelled()
