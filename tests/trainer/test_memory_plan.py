"""When a restart in place may resume from memory (checkpoint/memory_plan.py): pure decisions."""

from __future__ import annotations

import dataclasses

import pytest

from phalanx_trainer.checkpoint.memory_plan import (
    Expected,
    MemoryPlan,
    SnapshotHeader,
    plan_memory_restore,
    tensor_signature,
    why_unusable,
)

SIGNATURE = tensor_signature(
    {"model/w": ((4, 2), "torch.float32"), "optimizer/state/w/exp_avg": ((4, 2), "torch.float32")}
)
EXPECTED = Expected(
    step=40,
    checkpoint="step-00000040",
    save_id="5f1c",
    root="/ckpt/job-a",
    generation=2,
    rank=1,
    world_size=2,
    signature=SIGNATURE,
)
HEADER = SnapshotHeader(
    step=40,
    checkpoint="step-00000040",
    save_id="5f1c",
    root="/ckpt/job-a",
    generation=1,
    rank=1,
    world_size=2,
    signature=SIGNATURE,
    sha256="0" * 64,
    size=10,
)


def test_a_snapshot_of_the_same_step_folder_rank_and_layout_from_an_earlier_generation_is_used() -> None:
    assert why_unusable(HEADER, EXPECTED) is None
    assert (
        why_unusable(dataclasses.replace(HEADER, generation=0), EXPECTED) is None
    )  # a failed generation between


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"generation": 2}, "not older than 2"),
        ({"generation": 3}, "not older than 2"),
        ({"step": 30, "checkpoint": "step-00000030"}, "the gang resumes step-00000040"),
        ({"checkpoint": "step-00000050", "step": 50}, "snapshot of step-00000050"),
        # The same folder name written again since (a later save of that step): another save id.
        ({"save_id": "9a0b"}, "not the save the snapshot was taken with"),
        # Another job's checkpoints, should a memory folder ever be shared.
        ({"root": "/ckpt/job-b"}, "not /ckpt/job-a"),
        ({"rank": 0}, "snapshot of rank 0 of 2"),
        ({"world_size": 4}, "snapshot of rank 1 of 4"),
        (
            {"signature": tensor_signature({"model/w": ((2, 2), "torch.float32")})},
            "differ in key, shape or dtype",
        ),
    ],
)
def test_a_snapshot_that_does_not_provably_hold_the_resumed_state_is_refused_with_its_reason(
    change: dict[str, object], reason: str
) -> None:
    found = why_unusable(dataclasses.replace(HEADER, **change), EXPECTED)  # type: ignore[arg-type]
    assert found is not None and reason in found


def test_no_snapshot_is_refused() -> None:
    assert why_unusable(None, EXPECTED) == "no snapshot in this pod's memory"


def test_a_checkpoint_whose_manifest_records_no_save_id_matches_no_snapshot() -> None:
    no_id = dataclasses.replace(EXPECTED, save_id="")
    found = why_unusable(dataclasses.replace(HEADER, save_id=""), no_id)
    assert found is not None and "not the save" in found


def test_signature_sees_key_shape_and_dtype_not_order() -> None:
    a = {"x": ((2, 3), "torch.float32"), "y": ((1,), "torch.int64")}
    assert tensor_signature(a) == tensor_signature(dict(reversed(list(a.items()))))
    assert tensor_signature(a) != tensor_signature({**a, "x": ((3, 2), "torch.float32")})
    assert tensor_signature(a) != tensor_signature({**a, "x": ((2, 3), "torch.bfloat16")})
    assert tensor_signature(a) != tensor_signature({**a, "z": ((1,), "torch.int64")})


def test_header_round_trips_and_rejects_what_is_not_a_header() -> None:
    assert SnapshotHeader.from_json(HEADER.to_json()) == HEADER
    assert SnapshotHeader.from_json("{") is None
    assert SnapshotHeader.from_json('{"step": 1}') is None
    assert SnapshotHeader.from_json(HEADER.to_json().replace('"format": 1', '"format": 2')) is None
    assert SnapshotHeader.from_json(HEADER.to_json().replace('"step": 40', '"step": "40"')) is None


@pytest.mark.parametrize(
    ("usable", "replicated", "plan"),
    [
        ([True, True, True], False, MemoryPlan(source=None, receivers=())),
        ([True, True, True], True, MemoryPlan(source=None, receivers=())),
        ([True, False, True, False], True, MemoryPlan(source=0, receivers=(1, 3))),
        # Only rank 0 sends: it wrote the durable copy, and buffers may differ between replicas.
        ([False, True], True, None),
        # Sharded state: a rank without its snapshot has its shard only in storage.
        ([True, False], False, None),
        ([False, False], True, None),
        ([], True, None),
    ],
)
def test_the_gang_plan(usable: list[bool], replicated: bool, plan: MemoryPlan | None) -> None:
    assert plan_memory_restore(usable, replicated) == plan


def test_the_plan_names_its_source_for_the_log() -> None:
    assert MemoryPlan(None, ()).describe == "memory"
    assert MemoryPlan(0, (1,)).describe == "memory+peer"
