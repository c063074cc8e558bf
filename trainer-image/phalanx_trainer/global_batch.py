"""The global batch policy: how many sequences one optimizer step trains on, whatever the world size.

With `data.global_batch_size = G` (sequences per optimizer step) the gradient-accumulation steps are
derived for the data-parallel size `dp` of this launch, so an elastic resize keeps the loss trajectory
comparable: G / (batch_size x dp) when it divides; else, with `data.adjust_batch_size`, the fewest
accumulation steps whose per-rank micro-batch (G / dp / steps) fits under `batch_size`; else a
`GlobalBatchError` that names the fields and the data-parallel sizes that work.

Pure: no torch. `config.validate` and the trainer ask the same function, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# How many working world sizes an error lists: enough to pick one, short enough to read.
LISTED_SIZES = 8


class GlobalBatchError(ValueError):
    """The global batch cannot be split over this launch; the message names the fix."""


@dataclass(frozen=True)
class BatchPlan:
    micro_batch_size: int  # sequences per micro-batch per data-parallel rank
    grad_accumulation_steps: int
    dp: int
    global_batch_size: int  # micro_batch_size x dp x grad_accumulation_steps, always
    derived: bool  # from data.global_batch_size (false: the configured values, as given)
    adjusted: bool  # the micro-batch is below data.batch_size to make the global batch divide

    def as_json(self) -> dict[str, int | bool]:
        return {
            "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size,
            "grad_accumulation_steps": self.grad_accumulation_steps,
            "global_batch_derived": self.derived,
            "micro_batch_adjusted": self.adjusted,
        }


def _split(
    global_batch: int, batch_size: int, dp: int, pp_microbatches: int, adjust: bool
) -> tuple[int, int] | None:
    """(micro-batch, accumulation steps) for this dp, or None when nothing allowed divides."""
    if global_batch % dp:
        return None
    per_rank = global_batch // dp
    if per_rank % batch_size == 0:
        return batch_size, per_rank // batch_size
    if not adjust:
        return None
    # Fewest accumulation steps: the largest micro-batch that fits, so throughput suffers least.
    for steps in range(1, per_rank + 1):
        if per_rank % steps:
            continue
        micro = per_rank // steps
        if micro <= batch_size and micro % pp_microbatches == 0:
            return micro, steps
    return None


def plan_batch(
    *,
    global_batch_size: int,
    batch_size: int,
    grad_accumulation_steps: int,
    dp: int,
    model_parallel: int = 1,
    pp_microbatches: int = 1,
    adjust_batch_size: bool = False,
) -> BatchPlan:
    """The batch split for `dp` data-parallel ranks; `model_parallel` (tp x pp) only for messages.

    `pp_microbatches` is 1 without pipeline parallelism: with it, each micro-batch is cut into that
    many pipeline micro-batches, so an adjusted micro-batch must stay divisible by it.
    """
    if global_batch_size <= 0:
        return BatchPlan(
            micro_batch_size=batch_size,
            grad_accumulation_steps=grad_accumulation_steps,
            dp=dp,
            global_batch_size=batch_size * dp * grad_accumulation_steps,
            derived=False,
            adjusted=False,
        )
    split = _split(global_batch_size, batch_size, dp, pp_microbatches, adjust_batch_size)
    if split is None:
        raise GlobalBatchError(
            _no_split_message(
                global_batch_size, batch_size, dp, model_parallel, pp_microbatches, adjust_batch_size
            )
        )
    micro, steps = split
    return BatchPlan(
        micro_batch_size=micro,
        grad_accumulation_steps=steps,
        dp=dp,
        global_batch_size=global_batch_size,
        derived=True,
        adjusted=micro != batch_size,
    )


def small_micro_batch_warning(plan: BatchPlan, batch_size: int) -> dict[str, Any] | None:
    """A warning when data.adjust_batch_size took a micro-batch under half of `batch_size` (the
    configured one): the global batch stays, but each micro-step does far less work (at worst
    micro-batches of 1, when G / dp is a prime above batch_size)."""
    if not plan.adjusted or 2 * plan.micro_batch_size >= batch_size:
        return None
    return {
        "reason": "micro_batch_small",
        "micro_batch_size": plan.micro_batch_size,
        "batch_size": batch_size,
        "grad_accumulation_steps": plan.grad_accumulation_steps,
        "dp": plan.dp,
        "message": (
            f"data.adjust_batch_size shrank the per-rank micro-batch to {plan.micro_batch_size}, under "
            f"half of data.batch_size = {batch_size} ({plan.grad_accumulation_steps} accumulation steps "
            f"at dp = {plan.dp}): each step runs far below the throughput batch_size gives. Set "
            f"data.global_batch_size (now {plan.global_batch_size}) to a multiple of data.batch_size x "
            f"dp = {batch_size * plan.dp}, or run at a world size whose dp splits it in larger micro-batches"
        ),
    }


def working_dp_sizes(
    global_batch: int, batch_size: int, pp_microbatches: int, adjust: bool, limit: int = LISTED_SIZES
) -> list[int]:
    """The first `limit` data-parallel sizes that split `global_batch` under these settings."""
    found: list[int] = []
    for dp in range(1, global_batch + 1):
        if _split(global_batch, batch_size, dp, pp_microbatches, adjust) is not None:
            found.append(dp)
            if len(found) == limit:
                break
    return found


def _no_split_message(
    global_batch: int, batch_size: int, dp: int, model_parallel: int, pp_microbatches: int, adjust: bool
) -> str:
    world = dp * model_parallel
    sizes = working_dp_sizes(global_batch, batch_size, pp_microbatches, adjust)
    worlds = ", ".join(str(size * model_parallel) for size in sizes) or "none"
    where = f"world size {world}" + (f" / (tp x pp = {model_parallel})" if model_parallel > 1 else "")
    fixes = [f"run at a world size that works ({worlds})"]
    if not adjust:
        fixes.append("set data.adjust_batch_size = true to let the per-rank micro-batch shrink")
    fixes.append(f"or set data.global_batch_size to a multiple of data.batch_size x dp = {batch_size * dp}")
    return (
        f"data.global_batch_size = {global_batch} cannot be split over dp = {dp} data-parallel ranks "
        f"({where}) in micro-batches of data.batch_size = {batch_size}"
        + (f" divisible by parallelism.pp_microbatches = {pp_microbatches}" if pp_microbatches > 1 else "")
        + ": "
        + "; ".join(fixes)
    )


def resume_batch_warnings(
    *, written_global_batch: int | None, global_batch: int, consumed_samples: int | None
) -> list[dict[str, Any]]:
    """What a resume should warn about (each: `reason`, the numbers, `message`); [] when nothing.

    Warnings, not errors: the operator resizes a job by restarting it at another world size, and
    refusing here would turn every resize of a job without data.global_batch_size into a failure.
    `written_global_batch` is None for checkpoints from before the writer's batch was recorded.
    """
    found: list[dict[str, Any]] = []
    if written_global_batch is not None and written_global_batch != global_batch:
        found.append(
            {
                "reason": "global_batch_changed",
                "from_global_batch_size": written_global_batch,
                "global_batch_size": global_batch,
                "message": (
                    f"the checkpoint was written with a global batch of {written_global_batch} sequences "
                    f"per optimizer step and this launch trains with {global_batch}: the loss trajectory "
                    f"and the learning-rate schedule's meaning change. Set data.global_batch_size = "
                    f"{written_global_batch} to keep the writer's batch at any world size"
                ),
            }
        )
    if consumed_samples is not None and global_batch > 0 and consumed_samples % global_batch:
        found.append(
            {
                "reason": "data_position_off_step_boundary",
                "consumed_samples": consumed_samples,
                "global_batch_size": global_batch,
                "message": (
                    f"the checkpoint's data position ({consumed_samples} samples) is not a whole number "
                    f"of this launch's steps of {global_batch} samples: steps no longer start where "
                    "the writer's did. Set data.global_batch_size to the writer's global batch"
                ),
            }
        )
    return found
