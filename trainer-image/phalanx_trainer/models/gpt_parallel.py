"""GPT's parallelize plan, beside the model: which blocks a pipeline stage keeps, the Megatron-style
tensor-parallel plan with sequence and loss parallelism, and the units FSDP shards and
torch.compile compiles (one per block).

TP (torchtitan's layout): q/k/v and the MLP's first layer split by columns (heads / hidden units),
the attention output and the MLP's second layer by rows. Between those matmuls the residual stream
stays split along the sequence (sequence parallel): each norm sees S/tp positions, the row-split
matmuls reduce-scatter into that split, and each sub-layer all-gathers the sequence before its
column-split matmuls. The embeddings are split by rows (vocabulary, positions) and reduce-scatter
into the sequence split. The head is column-split and its logits stay split by vocabulary: the
trainer computes the loss under `loss_parallel` (around the pipeline schedule's step too), so no
rank holds B x S x V.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from phalanx_trainer.models.gpt import GPT
from phalanx_trainer.parallelize import ParallelizePlan


class GPTParallelizePlan(ParallelizePlan):
    def __init__(self, model: GPT) -> None:
        super().__init__(model)
        self.gpt = model

    def split_for_stage(self, stage: int, num_stages: int) -> None:
        """Keeps the contiguous blocks (and embeddings / head) that stage `stage` of `num_stages` owns;
        the ModuleDict keeps the others' names, so checkpoints match a one-process model."""
        model = self.gpt
        names = list(model.layers.keys())
        per_stage, extra = divmod(len(names), num_stages)
        start = stage * per_stage + min(stage, extra)
        stop = start + per_stage + (1 if stage < extra else 0)
        for name in names[:start] + names[stop:]:
            del model.layers[name]
        if stage > 0:
            model.tok_emb = None
            model.pos_emb = None
        if stage < num_stages - 1:
            model.ln_f = None
            model.head = None

    def apply_tensor_parallel(self, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
        sequence = Shard(1)  # (batch, sequence, features)
        gather_sequence = PrepareModuleInput(input_layouts=(sequence,), desired_input_layouts=(Replicate(),))
        for block in self.gpt.layers.values():
            plan: dict[str, Any] = {
                "ln1": SequenceParallel(),
                "attn": gather_sequence,
                "attn.wq": ColwiseParallel(),
                "attn.wk": ColwiseParallel(),
                "attn.wv": ColwiseParallel(),
                "attn.wo": RowwiseParallel(output_layouts=sequence),
                "ln2": SequenceParallel(),
                "mlp": gather_sequence,
                "mlp.w1": ColwiseParallel(),
                "mlp.w2": RowwiseParallel(output_layouts=sequence),
            }
            parallelize_module(block, tp_mesh, plan)
        if self.gpt.tok_emb is not None and self.gpt.pos_emb is not None:
            parallelize_module(
                self.gpt.tok_emb, tp_mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=sequence)
            )
            # positions are (sequence, features): their sequence dimension is 0
            parallelize_module(
                self.gpt.pos_emb, tp_mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
            )
        if self.gpt.ln_f is not None:
            parallelize_module(self.gpt.ln_f, tp_mesh, SequenceParallel())
        if self.gpt.head is not None:
            head = ColwiseParallel(
                input_layouts=sequence,
                output_layouts=Shard(-1) if loss_parallel else Replicate(),
                use_local_output=not loss_parallel,
            )
            parallelize_module(self.gpt.head, tp_mesh, head)

    def apply_compile(self) -> None:
        for name, block in list(self.gpt.layers.items()):
            self.gpt.layers[name] = torch.compile(block)  # type: ignore[assignment]

    def fsdp_units(self) -> list[nn.Module]:
        return list(self.gpt.layers.values())
