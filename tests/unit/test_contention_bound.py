"""The contention bench's zero-latency bound (bench/contention_bound.py): the utilization the
admission plan itself allows, against which the measured one is read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from contention_bound import zero_latency_utilization  # noqa: E402 (beside the benchmarks, not a package)

pytestmark = pytest.mark.unit


def test_gangs_that_tile_the_pool_exactly_use_all_of_it() -> None:
    # 4 nodes x 8 GPUs; eight gangs of 2 whole nodes: four waves, never a hole.
    gangs = [(f"g{i}", 2, 8) for i in range(8)]
    assert zero_latency_utilization(gangs, 4, 20.0) == pytest.approx(1.0)


def test_a_head_that_waits_for_whole_nodes_leaves_the_others_idle() -> None:
    # 2 nodes: a one-node gang runs, the two-node head behind it waits 20 s holding the free node.
    # Until the head starts at 20 s, half the GPUs worked: 0.5.
    gangs = [("small", 1, 8), ("head", 2, 8)]
    assert zero_latency_utilization(gangs, 2, 20.0) == pytest.approx(0.5)


def test_a_gang_that_can_never_fit_is_an_error_not_a_hang() -> None:
    with pytest.raises(RuntimeError, match="can never fit"):
        zero_latency_utilization([("huge", 3, 8)], 2, 20.0)


def test_each_start_a_second_late_costs_what_the_pool_idles_meanwhile() -> None:
    # Two waves of whole-pool gangs, each starting 1 s after its admission: the pool idles 1 s
    # before the first wave and 1 s between them; the second starts at 22 s, 20 of those 22 s used.
    gangs = [(f"g{i}", 2, 8) for i in range(4)]
    assert zero_latency_utilization(gangs, 4, 20.0, start_latency=1.0) == pytest.approx(20 / 22)


def test_stated_run_times_let_a_short_gang_use_the_node_a_blocked_head_would_idle() -> None:
    # 3 nodes: "a" takes two, the two-node head waits 20 s for them. Not knowing when they free, the
    # head holds the idle third node meanwhile (16 of 24 GPUs busy until the last start at 20 s);
    # knowing, it holds a's two nodes and "small" trains on the third.
    gangs = [("a", 2, 8), ("head", 2, 8), ("small", 1, 8)]
    assert zero_latency_utilization(gangs, 3, 20.0, stated=False) == pytest.approx(2 / 3)
    assert zero_latency_utilization(gangs, 3, 20.0, stated=True) == pytest.approx(1.0)
