"""Tensor parallelism keeps activations split: sequence parallel between the sharded matmuls (norms
see a slice of the sequence) and loss parallel (each rank holds its vocabulary slice of the
logits; the cross-entropy reduces over the split). No rank holds the whole B x S x V logits."""

from __future__ import annotations

from typing import Any

import pytest

from tests.trainer.trainer_harness import GLOBAL_BATCH, TINY, run_ranks

pytestmark = pytest.mark.trainer

VOCAB = 256  # the shipped text's byte vocabulary
SEQ = next(int(item.split("=")[1]) for item in TINY if item.startswith("model.seq_len="))
D_MODEL = next(int(item.split("=")[1]) for item in TINY if item.startswith("model.d_model="))


@pytest.fixture(scope="module")
def tp_runs() -> dict[str, Any]:
    return run_ranks(
        {
            # dp = 2 x tp = 2: 4 sequences per data-parallel rank
            "fsdp_x_tp": [
                "parallelism.tp=2",
                "parallelism.dp_mode=fsdp",
                f"data.batch_size={GLOBAL_BATCH // 2}",
            ],
            # pp = 2 x tp = 2, 2 pipeline micro-batches of 4 sequences
            "pp_x_tp": ["parallelism.tp=2", "parallelism.pp=2", f"data.batch_size={GLOBAL_BATCH}"],
        },
        world_size=4,
        steps=1,
    )


def test_each_rank_holds_its_vocabulary_slice_of_the_logits(tp_runs: dict[str, Any]) -> None:
    run = tp_runs["fsdp_x_tp"]
    assert "error" not in run, run.get("error")
    assert run["local_shapes"]["<root>"] == [GLOBAL_BATCH // 2, SEQ, VOCAB // 2]


def test_the_last_pipeline_stage_keeps_its_logits_split_too(tp_runs: dict[str, Any]) -> None:
    run = tp_runs["pp_x_tp"]
    assert "error" not in run, run.get("error")
    # Mesh (pp, dp, tp) = (2, 1, 2): ranks 2 and 3 are the last stage, which owns the head.
    for rank in (2, 3):
        assert run["local_shapes_by_rank"][rank]["<root>"] == [GLOBAL_BATCH // 2, SEQ, VOCAB // 2]


@pytest.mark.parametrize("layout", ["fsdp_x_tp", "pp_x_tp"])
def test_blocks_pass_on_their_slice_of_the_sequence(layout: str, tp_runs: dict[str, Any]) -> None:
    run = tp_runs[layout]
    assert "error" not in run, run.get("error")
    assert run["local_shapes"]["layers.0"] == [GLOBAL_BATCH // 2, SEQ // 2, D_MODEL]
