"""The manager on 2 gloo ranks: who verifies what at restore, ZeRO-1 through DCP, staging once per
replica, and the shared-storage check at commit.

One forked process per rank runs one scenario function of this file; each rank writes what it saw
to a JSON file that the test reads.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from phalanx_trainer.checkpoint import CheckpointConfig, CheckpointError, CheckpointManager
from phalanx_trainer.checkpoint import manifest as manifest_module
from phalanx_trainer.checkpoint.safe_load import load_small_state
from tests.trainer.trainer_harness import run_forked

WORLD = 2


class Progress:
    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def _model() -> nn.Module:
    torch.manual_seed(1234)  # the same weights on every rank
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def _train(module: nn.Module, optimizer: torch.optim.Optimizer, steps: int, rank: int) -> None:
    for step in range(steps):
        generator = torch.Generator().manual_seed(100 * step + rank)
        loss = module(torch.randn(4, 16, generator=generator)).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _weights(model: nn.Module) -> dict[str, list[float]]:
    return {name: param.detach().flatten().tolist() for name, param in model.state_dict().items()}


# --------------------------------------------------------------------------------------------------
# Scenarios: one function per case, run on every rank with (rank, folder, options).


def fsdp_save(rank: int, folder: Path, options: dict[str, Any]) -> dict[str, Any]:
    model = _model()
    mesh = init_device_mesh("cpu", (WORLD,))
    for index in (0, 2, 4):
        fully_shard(model[index], mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    progress = Progress()
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "progress": progress}
    manager = CheckpointManager(CheckpointConfig(dir=str(folder / "ckpt"), async_save=False, keep=5))
    hashed: list[str] = []
    if options.get("restore"):
        original = manifest_module.sha256_file
        failing = options.get("read_error_on_rank_1") if rank == 1 else None

        def recording(path: Path) -> str:
            hashed.append(Path(path).name)
            if failing == "hash" and Path(path).parent.name == "step-00000002":
                raise OSError(errno.EIO, "Input/output error", str(path))
            return original(path)

        original_read_bytes = Path.read_bytes

        def read_bytes(path: Path) -> bytes:
            if failing == "read" and path.parent.name == "step-00000002" and path.suffix == ".pt":
                raise OSError(errno.ESTALE, "Stale file handle", str(path))
            return original_read_bytes(path)

        manifest_module.sha256_file = recording
        Path.read_bytes = read_bytes  # type: ignore[method-assign]
        try:
            restored = manager.restore(state)
        finally:
            manifest_module.sha256_file = original
            Path.read_bytes = original_read_bytes  # type: ignore[method-assign]
        return {"restored": restored, "hashed": hashed, "step": progress.step}
    for step in (1, 2):
        _train(model, optimizer, 1, rank)
        progress.step = step
        manager.save(step, state)
    return {}


def zero1_save(rank: int, folder: Path, options: dict[str, Any]) -> dict[str, Any]:
    model = _model()
    replica = DistributedDataParallel(model)
    optimizer = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.AdamW, lr=1e-2)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "progress": Progress()}
    manager = CheckpointManager(CheckpointConfig(dir=str(folder / "ckpt"), async_save=True))
    if options.get("restore"):
        restored = manager.restore(state)
        inner = {
            name: {key: value.flatten().tolist() for key, value in optimizer.optim.state[param].items()}
            for name, param in model.named_parameters()
            if param in optimizer.optim.state
        }
        return {
            "restored": restored,
            "weights": _weights(model),
            "inner": inner,
            "lr": optimizer.param_groups[0]["lr"],
        }
    _train(replica, optimizer, 2, rank)
    # What an LR schedule does after a step: ZeRO copies it into its partition only at the next step.
    optimizer.param_groups[0]["lr"] = 0.005
    manager.save(2, state)
    manager.wait()
    owned = {
        name: {key: value.flatten().tolist() for key, value in optimizer.optim.state[param].items()}
        for name, param in model.named_parameters()
        if param in optimizer.optim.state
    }
    return {"weights": _weights(model), "inner": owned}


def ddp_staging(rank: int, folder: Path, options: dict[str, Any]) -> dict[str, Any]:
    model = _model()
    replica = DistributedDataParallel(model)
    optimizer: torch.optim.Optimizer
    if options["mode"] == "zero1":
        optimizer = ZeroRedundancyOptimizer(
            list(model.parameters()), optimizer_class=torch.optim.AdamW, lr=1e-2
        )
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "progress": Progress()}
    config = CheckpointConfig(dir=str(folder / options["mode"]), async_save=False)
    manager = CheckpointManager(config, replica_rank=rank)  # the data-parallel rank of a DDP replica
    if options.get("restore"):
        restored = manager.restore(state)
        return {"restored": restored, "weights": _weights(model)}
    _train(replica, optimizer, 2, rank)
    manager.save(2, state)
    staged = manager._staging._buffers  # noqa: SLF001 - what this rank holds in staging memory
    return {
        "weights": _weights(model),
        "staged_keys": sorted(staged),
        "staged_bytes": sum(t.numel() * t.element_size() for t in staged.values()),
    }


def node_local_disks(rank: int, folder: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Each rank's checkpoint folder is its own: what node-local disks mounted at one path look like."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "progress": Progress()}
    manager = CheckpointManager(CheckpointConfig(dir=str(folder / f"node-{rank}"), async_save=False))
    _train(model, optimizer, 1, rank)
    try:
        manager.save(1, state)
    except CheckpointError as error:
        return {"error": str(error)}
    return {"error": None}


SCENARIOS: dict[str, Callable[[int, Path, dict[str, Any]], dict[str, Any]]] = {
    "fsdp_save": fsdp_save,
    "zero1_save": zero1_save,
    "ddp_staging": ddp_staging,
    "node_local_disks": node_local_disks,
}


# --------------------------------------------------------------------------------------------------
# The harness.


def _rank_main(rank: int, world: int, port: int, scenario: str, folder: str, options: dict[str, Any]) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
    )
    tag = options.get("tag", scenario)
    with open(Path(folder) / f"{tag}.rank{rank}.log", "wb") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    torch.set_num_threads(1)
    code = 0
    try:
        dist.init_process_group("gloo")
        result = SCENARIOS[scenario](rank, Path(folder), options)
        dist.destroy_process_group()
    except Exception:
        result, code = {"exception": traceback.format_exc()}, 1
    (Path(folder) / f"{tag}.rank{rank}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(code)


def run_ranks(world: int, scenario: str, folder: Path, **options: Any) -> list[dict[str, Any]]:
    run_forked(world, _rank_main, lambda rank, port: (rank, world, port, scenario, str(folder), options))
    tag = options.get("tag", scenario)
    results = []
    for rank in range(world):
        path = folder / f"{tag}.rank{rank}.json"
        log = (folder / f"{tag}.rank{rank}.log").read_text(errors="replace")[-3000:]
        assert path.exists(), f"rank {rank} of {tag} wrote no result:\n{log}"
        result = json.loads(path.read_text())
        assert "exception" not in result, f"rank {rank} of {tag} raised:\n{result['exception']}\n{log}"
        results.append(result)
    return results


# --------------------------------------------------------------------------------------------------
# The tests.


@pytest.mark.trainer
def test_restore_verification_is_split_across_the_ranks_that_read(tmp_path: Path) -> None:
    run_ranks(WORLD, "fsdp_save", tmp_path)
    folder = tmp_path / "ckpt" / "step-00000002"
    listed = {entry["path"] for entry in json.loads((folder / "manifest.json").read_text())["files"]}
    results = run_ranks(WORLD, "fsdp_save", tmp_path, restore=True, tag="restore")
    assert [result["restored"] for result in results] == [2, 2]
    hashed = [result["hashed"] for result in results]
    every = [name for names in hashed for name in names]
    assert sorted(every) == sorted(set(every)), f"a file was hashed twice: {hashed}"
    assert set(every) == listed, "every file the ranks read is verified, by one of them"
    assert "rank-00001.pt" in hashed[1] and "rank-00001.pt" not in hashed[0], (
        f"rank 1 verifies its own per-rank file, rank 0 does not: {hashed}"
    )

    # Damage in a file only rank 1 reads is found by rank 1, and both ranks fall back together.
    damaged = folder / "rank-00001.pt"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    results = run_ranks(WORLD, "fsdp_save", tmp_path, restore=True, tag="fallback")
    assert [result["restored"] for result in results] == [1, 1]
    assert [result["step"] for result in results] == [1, 1]


@pytest.mark.trainer
@pytest.mark.parametrize("where", ["hash", "read"])
def test_a_read_error_on_one_rank_rejects_the_folder_on_every_rank(tmp_path: Path, where: str) -> None:
    """EIO / ESTALE while one rank verifies (hashing) or loads its per-rank file is the folder's
    damage: every rank falls back to the older checkpoint together, none dies in a collective."""
    run_ranks(WORLD, "fsdp_save", tmp_path)
    results = run_ranks(
        WORLD, "fsdp_save", tmp_path, restore=True, read_error_on_rank_1=where, tag=f"eio-{where}"
    )
    assert [result["restored"] for result in results] == [1, 1]
    assert [result["step"] for result in results] == [1, 1]


@pytest.mark.trainer
def test_zero1_optimizer_state_goes_through_dcp_and_reshards(tmp_path: Path) -> None:
    saved = run_ranks(WORLD, "zero1_save", tmp_path)
    folder = tmp_path / "ckpt" / "step-00000002"
    for rank in range(WORLD):
        small = load_small_state((folder / f"rank-{rank:05d}.pt").read_bytes())
        assert "optimizer" not in small["per_rank"], "the ZeRO-1 shard is still in the per-rank file"

    # Same world size: each rank gets its shard back exactly, and the learning rate of its groups.
    again = run_ranks(WORLD, "zero1_save", tmp_path, restore=True, tag="same-world")
    for before, after in zip(saved, again, strict=True):
        assert after["restored"] == 2
        assert after["inner"] == before["inner"]
        assert after["weights"] == before["weights"]
        assert after["lr"] == 0.005

    # One rank: it owns every parameter and takes the state both ranks wrote.
    alone = run_ranks(1, "zero1_save", tmp_path, restore=True, tag="one-rank")[0]
    merged = {**saved[0]["inner"], **saved[1]["inner"]}
    assert alone["restored"] == 2
    assert alone["inner"] == merged
    assert alone["weights"] == saved[0]["weights"]


@pytest.mark.trainer
@pytest.mark.parametrize("mode", ["ddp", "zero1"])
def test_replicated_state_is_staged_once_on_the_first_replica(tmp_path: Path, mode: str) -> None:
    first, second = run_ranks(WORLD, "ddp_staging", tmp_path, mode=mode)
    assert first["staged_bytes"] > 0
    assert all(key.startswith("model/") or key.startswith("optimizer/") for key in first["staged_keys"])
    if mode == "ddp":
        assert second["staged_bytes"] == 0, f"rank 1 staged a replica: {second['staged_keys'][:4]}"
    else:  # ZeRO-1: rank 1 stages its own optimizer shard and no model tensor
        assert second["staged_keys"] and all(key.startswith("optimizer/") for key in second["staged_keys"])
    restored = run_ranks(WORLD, "ddp_staging", tmp_path, mode=mode, restore=True, tag=f"{mode}-restore")
    for before, after in zip((first, second), restored, strict=True):
        assert after["restored"] == 2
        assert after["weights"] == before["weights"]


@pytest.mark.trainer
def test_node_local_checkpoint_folders_fail_the_first_commit_with_a_clear_message(tmp_path: Path) -> None:
    results = run_ranks(WORLD, "node_local_disks", tmp_path)
    for result in results:
        assert result["error"] is not None, "a checkpoint rank 0 cannot see in full was committed"
        assert "shared" in result["error"] and "docs/checkpoints.md" in result["error"], result["error"]
    assert not list((tmp_path / "node-0").glob("step-*")), "nothing is committed"
