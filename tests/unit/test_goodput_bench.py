"""bench/goodput_bench.py's arithmetic: the undisturbed pace from rank 0's progress lines, the one
step time every path is judged by, and a run's steps picked out of a log shared with earlier runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from phalanx.demo import ATTEMPT_HEADER, StepRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from goodput_bench import gap_profile, records_since, summarize, wall_step  # noqa: E402 (beside the benchmarks)

pytestmark = pytest.mark.unit


def records(times: list[float], first: int = 1) -> dict[int, StepRecord]:
    return {first + i: StepRecord(first + i, 1.0, 0.0, 0.0, 0.02, t) for i, t in enumerate(times)}


def test_the_pace_leaves_out_recoveries_stalls_and_the_first_step() -> None:
    # 28 ms steps, a 4 s recovery and a 0.3 s checkpoint stall in the tail, a slow first step.
    times = [0.0, 1.0] + [1.0 + 0.028 * i for i in range(1, 40)]
    times[20:] = [t + 4.0 for t in times[20:]]
    times[30:] = [t + 0.3 for t in times[30:]]
    assert wall_step(records(times).values()) == pytest.approx(0.028, abs=1e-9)


def test_whole_millisecond_times_average_out_where_a_median_would_not() -> None:
    # A true 27.6 ms step logged with truncated ms: each gap reads 27 or 28 ms; the median says 28.
    true = [i * 0.0276 for i in range(400)]
    logged = [int(t * 1000) / 1000 for t in true]
    assert wall_step(records(logged).values()) == pytest.approx(0.0276, abs=0.0002)


def test_too_few_steps_give_no_pace() -> None:
    assert wall_step(records([0.0, 0.03, 0.06]).values()) is None


def run(steps: int, wall: float, in_run: float | None) -> dict[str, object]:
    return {"steps": steps, "wall_seconds": wall, "in_run_step_seconds": in_run, "evictions": [],
            "restarts": {}, "ledger": {}}  # fmt: skip


def test_each_path_is_judged_by_the_stricter_of_the_reference_and_its_own_pace() -> None:
    # The reference (0.03 s) ran slower than the runs' own steps: by it alone, in place would score
    # above 1. The full restart ran later, on a quieter machine, at 0.026 s.
    reference = records([i * 0.03 for i in range(100)])
    result = summarize(
        reference, {"in_place": run(1000, 29.0, 0.028), "full_restart": run(1000, 27.0, 0.026)}
    )
    assert result["runs"]["in_place"]["step_seconds"] == pytest.approx(0.028)
    assert result["goodput"] == round(1000 * 0.028 / 29.0, 4)
    assert result["goodput_full_restart"] == round(1000 * 0.026 / 27.0, 4)
    assert result["runs"]["in_place"]["goodput_by_reference"] > 1.0
    assert result["runs"]["in_place"]["goodput_by_fastest_pace"] == round(1000 * 0.026 / 29.0, 4)
    # A reference faster than a run's own steps is the yardstick for that run.
    result = summarize(records([i * 0.025 for i in range(100)]), {"in_place": run(1000, 29.0, 0.028)})
    assert result["runs"]["in_place"]["step_seconds"] == pytest.approx(0.025)


def test_a_run_is_picked_out_of_a_log_shared_with_earlier_runs_by_its_event_times() -> None:
    def line(step: int, stamp: str) -> str:
        return json.dumps({"time": stamp, "event": "progress", "step": step, "loss": 1.0})

    text = "\n".join([
        f"{ATTEMPT_HEADER} old", line(1, "2026-12-05T04:00:00.000Z"), line(2, "2026-12-05T04:00:00.030Z"),
        f"{ATTEMPT_HEADER} new", line(1, "2026-12-05T04:11:00.000Z"), line(2, "2026-12-05T04:11:00.028Z"),
    ])  # fmt: skip
    kept = records_since(text, since=1796443860.0)  # 2026-12-05T04:11:00Z
    assert sorted(kept) == [1, 2] and kept[2].logged_at - kept[1].logged_at == pytest.approx(0.028, abs=1e-6)


def test_the_lost_time_is_split_by_kind_and_adds_up_to_the_wall_time() -> None:
    # 1,000 steps of 28 ms, every 4th one 32 ms; a 4 s recovery; submitted 5 s before the first step
    # and done 1 s after the last.
    times, t = [], 0.0
    for i in range(1000):
        times.append(t)
        t += 0.032 if i % 4 == 3 else 0.028
        if i == 500:
            t += 4.0
    kept = records(times)
    steps_run = run(1000, 0.0, wall_step(kept.values()))
    steps_run["gaps"] = gap_profile(kept.values())
    steps_run["wall_seconds"] = 5.0 + steps_run["gaps"]["span_seconds"] + 1.0  # type: ignore[operator]
    result = summarize(records([i * 0.03 for i in range(100)]), {"in_place": steps_run})
    lost = result["runs"]["in_place"]["lost_seconds"]
    assert lost["start_and_end"] == pytest.approx(6.0, abs=0.05)
    assert lost["recoveries_and_stalls"] == pytest.approx(4.028, abs=0.05)
    assert lost["steps_slower_than_the_pace"] == pytest.approx(1.0, abs=0.1)  # 250 steps 4 ms slower
    at_pace = result["runs"]["in_place"]["step_seconds"] * 1000
    assert at_pace + sum(lost.values()) == pytest.approx(steps_run["wall_seconds"], abs=0.2)
