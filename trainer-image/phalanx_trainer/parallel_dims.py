"""The parallel layout: dp x tp x pp over one DeviceMesh (pp outermost, tp innermost = fastest link).

`ParallelDims` validates itself: a layout that cannot train is refused when it is built, on the
resolved sizes (`dp = -1` takes what is left of the world), with one message per mistake naming the
field to change. `config.validate` asks the same object, so the launch and the trainer agree.
No torch import at module level: reading a config must not pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from phalanx_trainer.config import ParallelismConfig

SHARDED_DP_MODES = ("fsdp", "zero2")


class LayoutError(ValueError):
    """One message per layout mistake, ready to print."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    tp: int
    pp: int
    world_size: int
    dp_mode: str = "ddp"
    pp_schedule: str = "1f1b"
    pp_microbatches: int = 2
    dp_inferred: bool = False  # dp came from dp = -1: say so in messages

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise LayoutError(problems)

    @classmethod
    def from_config(cls, config: ParallelismConfig, world_size: int) -> ParallelDims:
        if config.tp < 1 or config.pp < 1:
            raise LayoutError(
                [f"parallelism.tp = {config.tp} and parallelism.pp = {config.pp}: must be >= 1"]
            )
        inferred = config.dp == -1
        if inferred and world_size % (config.tp * config.pp):
            raise LayoutError(
                [
                    f"world size {world_size} is not divisible by tp x pp = "
                    f"{config.tp} x {config.pp} = {config.tp * config.pp}"
                ]
            )
        return cls(
            dp=world_size // (config.tp * config.pp) if inferred else config.dp,
            tp=config.tp,
            pp=config.pp,
            world_size=world_size,
            dp_mode=config.dp_mode,
            pp_schedule=config.pp_schedule,
            pp_microbatches=config.pp_microbatches,
            dp_inferred=inferred,
        )

    def problems(self) -> list[str]:
        problems: list[str] = []
        product = self.dp * self.tp * self.pp
        if product != self.world_size:
            problems.append(
                f"dp x tp x pp = {self.dp} x {self.tp} x {self.pp} = {product} != world size {self.world_size}"
            )
        model_parallel = " and ".join(
            f"{name} = {size}" for name, size in (("tp", self.tp), ("pp", self.pp)) if size > 1
        )
        if self.dp > 1 and model_parallel and self.dp_mode not in SHARDED_DP_MODES:
            # DDP wraps TP's DTensor parameters as plain tensors and fails; under PP it hangs.
            source = f" (world size {self.world_size} / (tp x pp))" if self.dp_inferred else ""
            problems.append(
                f"parallelism.dp_mode = {self.dp_mode!r}: {model_parallel} with dp = {self.dp}{source} "
                'needs sharded data parallelism: use dp_mode = "fsdp" or "zero2", or dp = 1'
            )
        if self.pp > 1 and self.pp_schedule == "1f1b" and self.pp_microbatches < self.pp:
            problems.append(
                f"parallelism.pp_microbatches = {self.pp_microbatches} must be >= parallelism.pp = {self.pp} "
                f"under pp_schedule = '1f1b': set pp_microbatches = {self.pp} or more, or pp_schedule = 'gpipe'"
            )
        return problems

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) index of a global rank in the row-major ("pp", "dp", "tp") mesh."""
        pp_index, rest = divmod(rank, self.dp * self.tp)
        dp_index, tp_index = divmod(rest, self.tp)
        return pp_index, dp_index, tp_index

    def build_mesh(self, device_type: str) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=("pp", "dp", "tp"))


def layout_problems(config: ParallelismConfig, world_size: int) -> list[str]:
    """The layout's mistakes at this world size (empty when ParallelDims.from_config would succeed)."""
    try:
        ParallelDims.from_config(config, world_size)
    except LayoutError as err:
        return err.problems
    return []


def device_for(local_rank: int, preference: str) -> torch.device:
    import torch

    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
