"""The contention part's latency breakdown (bench/gang_bench.py turnover_latencies): the first gangs
timed from the submission, each later gang from the moment its nodes were freed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gang_bench import PodTimes, turnover_latencies  # noqa: E402 (beside the benchmarks, not a package)

pytestmark = pytest.mark.unit

START = 100.0


def times(group: str, node: str, seen: float, ungated: float, bound: float, running: float,
          finished: float | None) -> PodTimes:  # fmt: skip
    return PodTimes(group, 8, START + seen, START + bound, START + running,
                    None if finished is None else START + finished, START + ungated, node)  # fmt: skip


def test_first_gangs_count_from_the_submission_and_later_ones_from_their_last_node_freed() -> None:
    pods = [
        # a and b start at once on n0 and n1, and finish 20 s later (b's pod on n1 last, at 20.6).
        times("a", "n0", 0.1, 0.1, 0.3, 0.5, 20.5),
        times("b", "n1", 0.2, 0.2, 0.4, 0.7, 20.6),
        # c waits (gated) from the start for both nodes: freed at 20.6, ungated 0.2 s later.
        times("c", "n0", 0.3, 20.8, 21.0, 21.1, None),
        times("c", "n1", 0.3, 20.8, 21.2, 21.4, None),
    ]
    latency = turnover_latencies(pods, START)
    assert latency["first_gangs_pods"] == 2
    assert latency["submission_to_ungated_p50_seconds"] == pytest.approx(0.15)
    assert latency["submission_to_running_p50_seconds"] == pytest.approx(0.6)
    assert latency["turnovers"] == 1
    assert latency["freed_to_ungated_p50_seconds"] == pytest.approx(0.2)
    assert latency["freed_to_all_bound_p50_seconds"] == pytest.approx(0.6)  # its last pod bound at 21.2
    assert latency["freed_to_all_running_p50_seconds"] == pytest.approx(0.8)
    assert latency["freed_to_all_running_max_seconds"] == pytest.approx(0.8)


def test_a_gang_sharing_a_node_with_one_still_running_is_a_first_gang_not_a_turnover() -> None:
    pods = [
        times("a", "n0", 0.1, 0.1, 0.3, 0.5, None),  # still running at the end
        times("b", "n0", 0.2, 0.2, 0.4, 0.6, None),  # fits beside it: nothing had to finish
    ]
    latency = turnover_latencies(pods, START)
    assert latency["first_gangs_pods"] == 2 and latency["turnovers"] == 0
    assert latency["freed_to_all_running_p50_seconds"] is None


def test_a_gang_not_all_running_is_left_out() -> None:
    pods = [times("a", "n0", 0.1, 0.1, 0.3, 0.5, 20.5), PodTimes("b", 8, START + 0.2)]
    assert turnover_latencies(pods, START)["first_gangs_pods"] == 1
