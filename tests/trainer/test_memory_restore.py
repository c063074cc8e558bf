"""Restart in place from memory, with the real Trainer on 2 gloo ranks (checkpoint/memory.py).

Generation 0 trains, stops as at an agreed stop (the emergency checkpoint, then each rank's state into
its own "pod memory" folder); generation 1 builds a fresh Trainer and restores. Each case checks where
the state came from and that it is exactly what generation 0 held: every model and optimizer tensor,
and each rank's own data position, random streams and progress.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from phalanx_trainer.checkpoint import manager as manager_module
from phalanx_trainer.checkpoint.memory import local_data
from phalanx_trainer.checkpoint.state import collect, split_tensors
from phalanx_trainer.config import load_config
from phalanx_trainer.distenv import DistEnv
from phalanx_trainer.logs import EventLog
from phalanx_trainer.pod_memory import STATE_MEMORY_DIR_ENV
from phalanx_trainer.train import Trainer
from tests.trainer.trainer_harness import TINY, run_forked

pytestmark = pytest.mark.trainer

WORLD = 2
STEPS_BEFORE_STOP = 3


def _state(trainer: Trainer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sharded, per_rank = collect(trainer.app_state())
    _, tensors = split_tensors(sharded)
    return {key: local_data(t).detach().clone() for key, t in tensors.items()}, per_rank


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _trainer(overrides: list[str], folder: Path, rank: int, generation: int) -> Trainer:
    config = load_config(
        None,
        [
            *TINY,
            *overrides,
            "job.steps=50",
            f"checkpoint.dir={folder / 'ckpt'}",
            "checkpoint.async_save=false",
        ],
        WORLD,
    )
    # One rank per "pod": local rank 0 of node `rank`.
    env = DistEnv(rank, 0, WORLD, WORLD, rank, 1, "127.0.0.1", 0, 0, 60.0, True, generation)
    return Trainer(config, env, log=EventLog(rank=1))  # quiet


def scenario(rank: int, folder: Path, overrides: list[str], case: str) -> dict[str, Any]:
    memory = folder / f"pod-{rank}"
    memory.mkdir()  # what the pod's launcher does
    os.environ[STATE_MEMORY_DIR_ENV] = str(memory)
    first = _trainer(overrides, folder, rank, generation=0)
    app_state = first.app_state()
    for _ in range(STEPS_BEFORE_STOP):
        first.train_step()
    first.checkpoints.save(first.progress.step, app_state, emergency=True)  # the agreed stop's save
    kept_files = sorted(path.name for path in memory.iterdir())
    if case == "newer_checkpoint":
        first.train_step()  # a later generation trained on and checkpointed before failing
        first.checkpoints.save(first.progress.step, app_state)
        first.checkpoints.wait()
    expected_tensors, expected_per_rank = _state(first)
    first.close()
    del first, app_state
    dist.barrier()
    if case == "replacement_small_buckets":
        manager_module.BROADCAST_BUCKET_BYTES = 1024  # many buckets, tensors larger than one alone
    if case.startswith("replacement") and rank == 1 or case == "rank0_replaced" and rank == 0:
        shutil.rmtree(memory)  # a new pod: its memory folder is empty
        memory.mkdir()
    if rank == 1 and case == "damaged":
        data = memory / "local-0.pt"
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    dist.barrier()

    second = _trainer(overrides, folder, rank, generation=1)
    restored = second.checkpoints.restore(second.app_state())
    tensors, per_rank = _state(second)
    left = sorted(path.name for path in memory.iterdir()) if memory.exists() else []
    second.close()
    return {
        "kept_files": kept_files,
        "restored": restored,
        "source": second.checkpoints.restore_source,
        "tensors_equal": _same(tensors, expected_tensors),
        "tensor_keys": len(tensors),
        "per_rank_equal": _same(per_rank, expected_per_rank),
        "per_rank_keys": sorted(per_rank),
        "left_in_memory": left,
    }


def _rank_main(rank: int, port: int, folder: str, overrides: list[str], case: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    with open(Path(folder) / f"rank{rank}.log", "wb") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    torch.set_num_threads(1)
    code = 0
    try:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        result = scenario(rank, Path(folder), overrides, case)
        dist.destroy_process_group()
    except Exception:
        result, code = {"exception": traceback.format_exc()}, 1
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(code)


def run(folder: Path, overrides: list[str], case: str) -> list[dict[str, Any]]:
    run_forked(WORLD, _rank_main, lambda rank, port: (rank, port, str(folder), overrides, case))
    results = []
    for rank in range(WORLD):
        path = folder / f"rank{rank}.json"
        log = (folder / f"rank{rank}.log").read_text(errors="replace")[-3000:]
        assert path.exists(), f"rank {rank} wrote no result:\n{log}"
        result = json.loads(path.read_text())
        assert "exception" not in result, f"rank {rank} raised:\n{result['exception']}\n{log}"
        results.append(result)
    return results


DDP = ["parallelism.dp_mode=ddp", "data.batch_size=2", "parallelism.grad_accumulation_steps=2"]
DDP_BF16 = ["parallelism.dp_mode=ddp", "data.batch_size=4", "precision.dtype=bf16"]
FSDP = ["parallelism.dp_mode=fsdp", "data.batch_size=2", "parallelism.grad_accumulation_steps=2"]
ZERO1 = ["parallelism.dp_mode=zero1", "data.batch_size=4"]


@pytest.mark.parametrize(
    ("layout", "case", "sources"),
    [
        # Every rank kept its state: no rank reads storage, whatever the layout.
        ("ddp-accum2", "all_kept", ["memory", "memory"]),
        ("fsdp-accum2", "all_kept", ["memory", "memory"]),
        ("zero1", "all_kept", ["memory", "memory"]),
        # Rank 1's pod was replaced: DDP's state is the same on every rank, so rank 0 sends it.
        ("ddp-accum2", "replacement", ["memory+peer", "memory+peer"]),
        ("ddp-bf16", "replacement", ["memory+peer", "memory+peer"]),
        ("ddp-accum2", "replacement_small_buckets", ["memory+peer", "memory+peer"]),
        # Sharded state (FSDP's model, ZeRO-1's optimizer): rank 1's shard is only in storage.
        ("fsdp-accum2", "replacement", ["storage", "storage"]),
        ("zero1", "replacement", ["storage", "storage"]),
        # Not provably the same state: storage, as before.
        ("ddp-accum2", "damaged", ["storage", "storage"]),
        # Only rank 0 sends (it wrote the durable copy); losing it is a full restart in practice.
        ("ddp-accum2", "rank0_replaced", ["storage", "storage"]),
        ("ddp-accum2", "newer_checkpoint", ["storage", "storage"]),
    ],
)
def test_generation_1_restores_exactly_generation_0s_state_from_memory_where_it_provably_can(
    tmp_path: Path, layout: str, case: str, sources: list[str]
) -> None:
    overrides = {"ddp-accum2": DDP, "ddp-bf16": DDP_BF16, "fsdp-accum2": FSDP, "zero1": ZERO1}[layout]
    results = run(tmp_path, overrides, case)
    expected_step = STEPS_BEFORE_STOP + (1 if case == "newer_checkpoint" else 0)
    assert [r["restored"] for r in results] == [expected_step] * WORLD
    assert [r["source"] for r in results] == sources
    for rank, result in enumerate(results):
        assert result["kept_files"] == ["local-0.json", "local-0.pt"]
        assert result["tensors_equal"] and result["tensor_keys"] > 0, f"rank {rank}"
        assert result["per_rank_equal"], f"rank {rank}: data position, random streams or progress differ"
        assert {"data", "progress", "rng"} <= set(result["per_rank_keys"])
        assert result["left_in_memory"] == []  # used or not, freed
