"""GPT's parallelize plan, beside the model: which blocks a pipeline stage keeps, the Megatron-style
tensor-parallel plan, and the units FSDP shards and torch.compile compiles (one per block).

TP: q/k/v and the MLP's first layer split by columns (heads / hidden units), the attention output
and the MLP's second layer by rows, so each block needs one all-reduce forward and one backward per
sub-layer. The head is column-split and gathered.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

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

    def apply_tensor_parallel(self, tp_mesh: DeviceMesh) -> None:
        for block in self.gpt.layers.values():
            plan: dict[str, Any] = {
                "attn.wq": ColwiseParallel(),
                "attn.wk": ColwiseParallel(),
                "attn.wv": ColwiseParallel(),
                "attn.wo": RowwiseParallel(),
                "mlp.w1": ColwiseParallel(),
                "mlp.w2": RowwiseParallel(),
            }
            parallelize_module(block, tp_mesh, plan)
        if self.gpt.head is not None:
            parallelize_module(self.gpt.head, tp_mesh, ColwiseParallel(output_layouts=Replicate()))

    def apply_compile(self) -> None:
        for name, block in list(self.gpt.layers.items()):
            self.gpt.layers[name] = torch.compile(block)  # type: ignore[assignment]

    def fsdp_units(self) -> list[nn.Module]:
        return list(self.gpt.layers.values())
