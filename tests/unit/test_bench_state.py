"""A benchmark's cluster state folder (~750 MiB of etcd) goes after a run that succeeded and stays
after one that failed, for its logs: runs back to back used to fill the disk."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gang_bench import remove_state  # noqa: E402 (beside the benchmarks, not a package)

pytestmark = pytest.mark.unit


def state(tmp_path: Path) -> Path:
    folder = tmp_path / "phalanx-bench-gang-x"
    (folder / "etcd").mkdir(parents=True)
    (folder / "operator.log").write_text("log")
    return folder


def test_a_succeeded_runs_state_is_removed(tmp_path: Path) -> None:
    folder = state(tmp_path)
    remove_state(folder, succeeded=True)
    assert not folder.exists()


def test_a_failed_runs_state_is_kept_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = state(tmp_path)
    remove_state(folder, succeeded=False)
    assert (folder / "operator.log").read_text() == "log"
    assert str(folder) in capsys.readouterr().err
