"""The manager in one process: fallback from each kind of damage, malicious files refused, emergency
budget, a SIGTERM save during an async save, retention, staging that does not alias live weights."""

from __future__ import annotations

import io
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import REGISTRY
from torch import nn

from phalanx_trainer.checkpoint import CheckpointConfig, CheckpointError, CheckpointManager
from phalanx_trainer.checkpoint import manager as manager_module
from phalanx_trainer.checkpoint.manifest import describe_file, parse_manifest, write_manifest
from phalanx_trainer.checkpoint.rng import RngState
from phalanx_trainer.checkpoint.safe_load import UnsafeCheckpointError, dump_small_state, read_dcp_metadata
from phalanx_trainer.checkpoint.state import StagingArea

pytestmark = pytest.mark.unit


class Progress:
    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def new_state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + s))
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "rng": RngState(),
        "progress": Progress(),
    }


def train(state: dict[str, Any], steps: int) -> None:
    for _ in range(steps):
        loss = state["model"](torch.randn(4, 8)).pow(2).mean()
        state["optimizer"].zero_grad()
        loss.backward()
        state["optimizer"].step()
        state["scheduler"].step()
        state["progress"].step += 1


def weights(state: dict[str, Any]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in state["model"].parameters()]


def fallbacks() -> float:
    return REGISTRY.get_sample_value("phalanx_trainer_checkpoint_fallbacks_total") or 0.0


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, list[torch.Tensor]]]:
    """Committed checkpoints at steps 2 and 4, and the weights each holds."""
    root = tmp_path_factory.mktemp("ckpt")
    state = new_state()
    manager = CheckpointManager(CheckpointConfig(dir=str(root), async_save=False))
    saved: dict[int, list[torch.Tensor]] = {}
    for step in (2, 4):
        train(state, 2)
        manager.save(step, state)
        saved[step] = weights(state)
    return root, saved


@pytest.fixture
def root(two_checkpoints: tuple[Path, dict[int, list[torch.Tensor]]], tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(two_checkpoints[0], copy)
    return copy


def restore(root: Path) -> tuple[int | None, dict[str, Any]]:
    state = new_state(seed=99)
    return CheckpointManager(CheckpointConfig(dir=str(root))).restore(state), state


def rewrite_manifest(folder: Path) -> None:
    """What an attacker who can write the folder does: make the manifest match the planted files."""
    manifest = parse_manifest((folder / "manifest.json").read_text())
    files = tuple(describe_file(folder, entry.path) for entry in manifest.files)
    write_manifest(folder, manifest.__class__(**{**manifest.__dict__, "files": files}))


def test_newest_valid_checkpoint_restores_exact_state(
    root: Path, two_checkpoints: tuple[Path, dict[int, list[torch.Tensor]]]
) -> None:
    step, state = restore(root)
    assert step == 4 and state["progress"].step == 4
    assert all(torch.equal(a, b) for a, b in zip(weights(state), two_checkpoints[1][4], strict=True))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": (lambda d: truncate(d / "__0_0.distcp"), "__0_0.distcp has"),
    "flipped-byte": (lambda d: flip(d / "__0_0.distcp"), "sha256 mismatch"),
    "missing-manifest": (lambda d: (d / "manifest.json").unlink(), "manifest.json is missing"),
    "missing-metadata": (lambda d: (d / ".metadata").unlink(), ".metadata is missing"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_newest_falls_back_to_previous_and_reports_it(
    root: Path,
    two_checkpoints: tuple[Path, dict[int, list[torch.Tensor]]],
    kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    damage, reason = DAMAGE[kind]
    damage(root / "step-00000004")
    before = fallbacks()
    with caplog.at_level(logging.WARNING, logger="phalanx_trainer.checkpoint"):
        step, state = restore(root)
    assert step == 2
    assert all(torch.equal(a, b) for a, b in zip(weights(state), two_checkpoints[1][2], strict=True))
    assert fallbacks() == before + 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step-00000004" in w and reason in w for w in warnings), warnings


def test_half_written_temporary_is_never_loaded_and_is_cleaned_up(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    temporary = root / f".tmp-step-00000006-{uuid.uuid4().hex}"
    shutil.copytree(root / "step-00000004", temporary)  # complete-looking, but never renamed
    (temporary / "manifest.json").unlink()
    before = fallbacks()
    with caplog.at_level(logging.WARNING, logger="phalanx_trainer.checkpoint"):
        step, _ = restore(root)
    assert step == 4
    assert not temporary.exists()
    assert fallbacks() == before + 1
    assert any("never committed" in r.getMessage() for r in caplog.records)


def test_no_valid_checkpoint_means_fresh_start(root: Path) -> None:
    for folder in root.glob("step-*"):
        (folder / "manifest.json").unlink()
    step, state = restore(root)
    assert step is None and state["progress"].step == 0


class PlantsMarker:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_the_marker_payload_really_runs_code_when_unpickled(tmp_path: Path) -> None:
    import pickle

    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(PlantsMarker(marker)))  # noqa: S301 - proving the payload is live
    assert marker.exists()


@pytest.mark.parametrize("target", [".metadata", "rank-00000.pt"])
def test_a_checkpoint_file_that_would_run_code_is_refused(
    root: Path, tmp_path: Path, target: str, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "pwned"
    newest = root / "step-00000004"
    payload = io.BytesIO()
    if target == ".metadata":
        import pickle

        pickle.dump(PlantsMarker(marker), payload)
    else:
        torch.save({"sharded": {}, "per_rank": {"progress": PlantsMarker(marker)}}, payload)
    (newest / target).write_bytes(payload.getvalue())
    rewrite_manifest(newest)  # the hashes match: only the loader stands between the file and the code
    with caplog.at_level(logging.WARNING, logger="phalanx_trainer.checkpoint"):
        step, _ = restore(root)
    assert not marker.exists(), "loading the checkpoint ran code"
    assert step == 2
    warnings = " ".join(r.getMessage() for r in caplog.records)
    assert "step-00000004" in warnings and ("not allowed" in warnings or "weights_only" in warnings), warnings


def test_metadata_reader_refuses_arbitrary_globals(tmp_path: Path) -> None:
    import pickle

    (tmp_path / ".metadata").write_bytes(pickle.dumps(PlantsMarker(tmp_path / "x")))
    with pytest.raises(UnsafeCheckpointError, match="posix.system|os.system|nt.system"):
        read_dcp_metadata(tmp_path / ".metadata")
    assert not (tmp_path / "x").exists()


def test_state_that_would_not_load_safely_is_refused_at_save_time() -> None:
    with pytest.raises(TypeError, match="weights_only"):
        dump_small_state({"progress": {"when": PlantsMarker(Path("/nonexistent"))}})


def test_emergency_save_over_budget_is_skipped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = new_state()
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path), emergency_budget_seconds=0.0))
    train(state, 1)
    with caplog.at_level(logging.WARNING, logger="phalanx_trainer.checkpoint"):
        manager.save(1, state, emergency=True)
    assert not list(tmp_path.glob("step-*"))
    assert any("emergency checkpoint at step 1 skipped" in r.getMessage() for r in caplog.records)


def test_emergency_save_during_an_async_save_completes_that_save_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save = manager_module.dcp_save
    finished: list[float] = []

    def slow_save(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        result = real_save(*args, **kwargs)
        finished.append(time.monotonic())
        return result

    monkeypatch.setattr(manager_module, "dcp_save", slow_save)
    state = new_state()
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path), emergency_budget_seconds=60.0))
    train(state, 1)
    manager.save(1, state)  # asynchronous: returns while the write sleeps
    assert not (tmp_path / "step-00000001").exists()
    train(state, 1)
    manager.save(2, state, emergency=True)
    assert (tmp_path / "step-00000001").exists() and (tmp_path / "step-00000002").exists()
    assert len(finished) == 2 and finished[0] < finished[1]
    manifest = parse_manifest((tmp_path / "step-00000002" / "manifest.json").read_text())
    assert manifest.emergency and manifest.step == 2
    assert manager.last is not None and manager.last.step == 2


def test_async_save_returns_before_the_write_and_training_may_change_weights(tmp_path: Path) -> None:
    state = new_state()
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    train(state, 1)
    expected = weights(state)
    manager.save(1, state)
    train(state, 3)  # changes the live weights while the write may still be running
    manager.wait()
    step, restored = restore(tmp_path)
    assert step == 1
    assert all(torch.equal(a, b) for a, b in zip(weights(restored), expected, strict=True))


def test_retention_keeps_the_newest_complete_checkpoints(tmp_path: Path) -> None:
    state = new_state()
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path), keep=2))
    for step in range(1, 6):
        train(state, 1)
        manager.save(step, state)
    manager.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]
    assert manager.status()["step"] == 5
    assert REGISTRY.get_sample_value("phalanx_trainer_checkpoint_last_step") == 5


def test_staging_copies_and_reuses_buffers() -> None:
    area = StagingArea()
    live = {"w": torch.arange(6, dtype=torch.float32)}
    first = area.stage(live)
    live["w"].add_(100)
    assert torch.equal(first["w"], torch.arange(6, dtype=torch.float32)), "staged tensor aliases the live one"
    second = area.stage(live)
    assert second["w"].data_ptr() == first["w"].data_ptr(), "buffers are not reused"
    assert torch.equal(second["w"], live["w"])


def test_a_damaged_folder_does_not_count_towards_keep(tmp_path: Path) -> None:
    state = new_state()
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path), keep=2, async_save=False))
    for step in (1, 2):
        train(state, 1)
        manager.save(step, state)
    damaged = tmp_path / "step-00000003"
    shutil.copytree(tmp_path / "step-00000002", damaged)
    (damaged / "manifest.json").write_text("{")  # say, a copy that was cut short
    train(state, 1)
    manager.save(4, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000004"]


def test_a_folder_rejected_at_resume_does_not_count_towards_keep(root: Path) -> None:
    # step 4's data is damaged in a way only the digest shows (same size).
    flip(next((root / "step-00000004").glob("__0_*.distcp")))
    state = new_state(seed=99)
    manager = CheckpointManager(CheckpointConfig(dir=str(root), keep=2, async_save=False))
    assert manager.restore(state) == 2
    for step in (3, 5):
        train(state, 1)
        manager.save(step, state)
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00000003", "step-00000005"]


def test_a_configured_write_speed_replaces_the_assumed_one(tmp_path: Path) -> None:
    state = {"model": nn.Linear(1024, 1024), "progress": Progress()}  # 4 MB: 21 ms at 200 MB/s
    config = CheckpointConfig(dir=str(tmp_path), emergency_budget_seconds=0.015, write_bytes_per_second=100e9)
    manager = CheckpointManager(config)
    manager.save(1, state, emergency=True)
    assert (tmp_path / "step-00000001").is_dir(), "skipped although 4 MB at 100 GB/s fits in 15 ms"


def test_the_storage_speed_is_measured_at_start(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    assert manager.restore(new_state()) is None
    assert manager.storage_bytes_per_second is not None and manager.storage_bytes_per_second > 0
    assert [p.name for p in tmp_path.iterdir()] == [".storage-probe.json"], "the probe leaves only its figure"


def test_a_probe_record_that_cannot_be_written_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from phalanx_trainer.checkpoint import store

    def refuse(src: object, dst: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(store.os, "replace", refuse)
    with pytest.raises(OSError):
        store.write_probe_record(tmp_path, 1e9, 2, 1, time.time())
    assert list(tmp_path.iterdir()) == []


def test_a_later_start_reuses_the_probe_instead_of_writing_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    first.restore(new_state())
    probed = first.storage_bytes_per_second

    def no_probe(self: CheckpointManager) -> float | None:
        raise AssertionError("probed again within the reuse window")

    monkeypatch.setattr(CheckpointManager, "_probe_storage", no_probe)
    again = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))  # a restart: a new process, same folder
    again.restore(new_state())
    assert again.storage_bytes_per_second == probed


def test_a_probe_from_another_world_size_or_too_old_is_measured_again(tmp_path: Path) -> None:
    from phalanx_trainer.checkpoint.budget import PROBE_REUSE_SECONDS
    from phalanx_trainer.checkpoint.store import write_probe_record

    for world_size, age in ((4, 0.0), (1, PROBE_REUSE_SECONDS + 1)):
        write_probe_record(tmp_path, 1.0, world_size, 1, time.time() - age)  # 1 B/s: unmistakable
        manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
        manager.restore(new_state())
        assert manager.storage_bytes_per_second not in (None, 1.0), (world_size, age)


def test_restore_refuses_a_fresh_start_over_weights_a_damaged_checkpoint_overwrote(root: Path) -> None:
    # Digests are checked while DCP loads, so a folder whose data is damaged has already been read
    # into the live state when it is rejected: with no older one to load over it, starting "fresh"
    # would train from those weights.
    for folder in root.glob("step-*"):
        flip(next(folder.glob("__0_*.distcp")))
    with pytest.raises(CheckpointError, match="start fresh"):
        restore(root)


def test_files_per_rank_follow_the_cores_of_the_ranks_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert manager_module.io_threads_per_rank({}) == 4, "at most 4"
    assert manager_module.io_threads_per_rank({"NPROC_PER_NODE": "8"}) == 2
    assert manager_module.io_threads_per_rank({"NPROC_PER_NODE": "32"}) == 1, "at least 1"
    assert manager_module.io_threads_per_rank({"NPROC_PER_NODE": "many"}) == 4
