"""The parallel layout: dp x tp x pp over one DeviceMesh (pp outermost, tp innermost = fastest link)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from phalanx_trainer.config import ParallelismConfig, resolve_dp, validate_layout


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    tp: int
    pp: int
    world_size: int

    @classmethod
    def from_config(cls, config: ParallelismConfig, world_size: int) -> ParallelDims:
        problems = validate_layout(config, world_size)
        if problems:
            raise ValueError(problems[0])
        return cls(dp=resolve_dp(config, world_size), tp=config.tp, pp=config.pp, world_size=world_size)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) index of a global rank in the row-major ("pp", "dp", "tp") mesh."""
        pp_index, rest = divmod(rank, self.dp * self.tp)
        dp_index, tp_index = divmod(rest, self.tp)
        return pp_index, dp_index, tp_index

    def build_mesh(self, device_type: str) -> DeviceMesh:
        return init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=("pp", "dp", "tp"))


def device_for(local_rank: int, preference: str) -> torch.device:
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
