"""A rank's snapshot in its pod's memory (checkpoint/memory.py) and the launcher's folder (pod_memory.py):
one process, no process group."""

from __future__ import annotations

import errno
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from phalanx_trainer.checkpoint import memory as memory_module
from phalanx_trainer.checkpoint.memory import StateMemory
from phalanx_trainer.pod_memory import FOLDER_PREFIX, cgroup_memory_headroom, make_pod_folder, sweep_orphans

pytestmark = pytest.mark.trainer


def _write(memory: StateMemory, tensors: dict[str, torch.Tensor], **changes: Any) -> Any:
    arguments: dict[str, Any] = {
        "step": 7,
        "checkpoint": "step-00000007",
        "save_id": "abc",
        "root": "/ckpt",
        "world_size": 2,
        "small_state": b"per-rank bytes",
        "tensors": tensors,
    }
    return memory.write(**{**arguments, **changes})


def test_a_snapshot_round_trips_and_its_header_is_claimed_once(tmp_path: Path) -> None:
    memory = StateMemory(tmp_path, rank=1, generation=0)
    tensors = {"model/w": torch.randn(4, 3), "optimizer/state/w/step": torch.tensor(5.0)}
    header = _write(memory, tensors)
    assert header is not None and header.rank == 1 and header.generation == 0 and header.save_id == "abc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local-0.json", "local-0.pt"]

    claimed = memory.claim()
    assert claimed == header
    assert memory.claim() is None  # a restore that died halfway finds nothing the second time
    kept, small = memory.read(claimed)
    assert small == b"per-rank bytes"
    assert kept.keys() == tensors.keys() and all(torch.equal(kept[k], tensors[k]) for k in tensors)
    memory.discard()
    assert list(tmp_path.iterdir()) == []


def test_damaged_data_is_refused(tmp_path: Path) -> None:
    memory = StateMemory(tmp_path, rank=0, generation=0)
    header = _write(memory, {"model/w": torch.randn(64)})
    data = tmp_path / "local-0.pt"
    raw = bytearray(data.read_bytes())
    raw[-100] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="does not match its header"):
        memory.read(header)


def test_a_view_writes_its_own_elements_not_its_whole_storage(tmp_path: Path) -> None:
    big = torch.zeros(1_000_000)  # 4 MB of storage
    header = _write(StateMemory(tmp_path, rank=0, generation=0), {"model/w": big[:10]})
    assert header is not None and header.size < 64 * 1024


def test_a_snapshot_over_its_share_of_the_memory_left_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory_module, "cgroup_memory_headroom", lambda: 4 * 400_000.0)
    # 8 local ranks share half of 1.6 MB: 100 kB each; 400 kB of tensors does not fit.
    memory = StateMemory(tmp_path, rank=0, generation=0, local_ranks=8)
    assert _write(memory, {"model/w": torch.zeros(100_000)}) is None
    assert list(tmp_path.iterdir()) == []
    assert _write(memory, {"model/w": torch.zeros(1_000)}) is not None  # 4 kB fits


def test_a_snapshot_that_would_outlast_the_stops_budget_is_skipped(tmp_path: Path) -> None:
    memory = StateMemory(tmp_path, rank=0, generation=0)
    assert _write(memory, {"model/w": torch.zeros(1000)}, seconds_left=0.0) is None
    assert list(tmp_path.iterdir()) == []


def test_a_write_cut_short_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def filling_up(obj: object, handle: Any) -> None:
        handle.write(b"x" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device")

    memory = StateMemory(tmp_path, rank=0, generation=0)
    assert _write(memory, {"model/w": torch.zeros(10)}) is not None
    monkeypatch.setattr(memory_module.torch, "save", filling_up)
    assert _write(memory, {"model/w": torch.zeros(10)}) is None
    assert list(tmp_path.iterdir()) == []  # neither the partial file nor the older snapshot


def test_a_renumbered_rank_overwrites_its_pods_files_instead_of_leaving_them(tmp_path: Path) -> None:
    assert _write(StateMemory(tmp_path, rank=3, generation=0), {"model/w": torch.zeros(10)}) is not None
    header = _write(StateMemory(tmp_path, rank=5, generation=1), {"model/w": torch.zeros(10)})
    assert header is not None and header.rank == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local-0.json", "local-0.pt"]


def test_no_snapshot_once_the_launcher_removed_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    assert _write(StateMemory(folder, rank=0, generation=0), {"model/w": torch.zeros(10)}) is None
    assert not folder.exists()  # not created again behind the launcher's back


def test_the_launcher_folder_is_fresh_and_orphans_of_dead_launchers_are_swept(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    orphan = tmp_path / f"{FOLDER_PREFIX}{int(dead.stdout)}-x1"
    orphan.mkdir()
    (orphan / "local-0.pt").write_bytes(b"left by a SIGKILLed launcher")
    mine = make_pod_folder(tmp_path)
    assert mine is not None and mine.name.startswith(f"{FOLDER_PREFIX}{os.getpid()}-")
    assert not orphan.exists()
    assert make_pod_folder(tmp_path) != mine  # each incarnation its own
    assert sweep_orphans(tmp_path) == []  # this process's folders stay
    assert mine.exists()


def test_cgroup_headroom(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir()
    v1.mkdir()
    assert cgroup_memory_headroom(v2, v1) == math.inf  # nothing to read
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("123\n")
    assert cgroup_memory_headroom(v2, v1) == math.inf
    (v2 / "memory.max").write_text("1000\n")
    assert cgroup_memory_headroom(v2, v1) == 877
    (v2 / "memory.current").write_text("2000\n")
    assert cgroup_memory_headroom(v2, v1) == 0
    (v1 / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    (v1 / "memory.usage_in_bytes").write_text("10")
    assert cgroup_memory_headroom(tmp_path / "none", v1) == math.inf
