"""bench/gang_bench.py's command line: a warm-up round of no gangs is refused (the first measured
round would then fall on a fresh control plane, on one side only in ABBA order)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gang_bench import arguments  # noqa: E402 (beside the benchmarks, not a package)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("warmup", ["0", "-3"])
def test_a_warm_up_of_fewer_than_one_gang_is_refused_naming_the_flag(
    warmup: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        arguments(["--warmup-jobs", warmup])
    assert "--warmup-jobs" in capsys.readouterr().err


def test_a_small_warm_up_is_taken() -> None:
    assert arguments(["--warmup-jobs", "1"]).warmup_jobs == 1
