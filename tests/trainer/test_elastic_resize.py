"""Elastic resize through the real Trainer: 2 ranks -> checkpoint -> 1 rank -> checkpoint -> 2 ranks.

Against an uninterrupted 2-rank run of the same job, for DDP, FSDP and ZeRO-2, each with gradient
accumulation that changes with the world size (data.global_batch_size), one of them with a per-rank
micro-batch that changes too (data.adjust_batch_size):

- every optimizer step trains on exactly the same samples: global step s takes samples
  (s-1) x G ... s x G - 1 of the stream at every world size, none skipped or repeated. Which rank and
  micro-step holds a sample differs between sizes; the step's mean gradient does not depend on that
  (up to the order of floating-point sums);
- the loss trajectory stays within LOSS_TOLERANCE (relative) of the fixed-size run, and is bitwise
  identical before the first resize;
- the start line logs the global batch and the derived split; the resume line and the manifest name
  the world size and global batch the checkpoint was written with.

The schedule is constant: each phase is its own run with job.steps at the phase's end, and the LR of a
cosine schedule would depend on job.steps.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from phalanx.ports import free_port
from phalanx_trainer.checkpoint.manifest import MANIFEST_NAME
from phalanx_trainer.checkpoint.state import checkpointed_optimizer
from phalanx_trainer.config import load_config
from phalanx_trainer.dataset import SampleSource
from phalanx_trainer.distenv import DistEnv
from phalanx_trainer.logs import EventLog
from phalanx_trainer.train import Trainer
from tests.trainer.trainer_harness import COLLECTIVE_TIMEOUT_S, TINY

pytestmark = pytest.mark.trainer

STEPS = 6
RESIZED_AT = (2, 4)  # 2 ranks train steps 1-2, 1 rank steps 3-4, 2 ranks steps 5-6
# Measured on CPU (fp32): 0 for ddp and fsdp, 9.4e-8 for zero2-adjusted (only the order of sums changes).
LOSS_TOLERANCE = 1e-6
LAYOUTS: dict[str, tuple[list[str], int]] = {
    # name: (overrides, global batch)
    "ddp": (["parallelism.dp_mode=ddp", "data.batch_size=4", "data.global_batch_size=16"], 16),
    "fsdp": (["parallelism.dp_mode=fsdp", "data.batch_size=4", "data.global_batch_size=16"], 16),
    # 12 over 2 ranks is 6 each: 2 micro-batches of 3; on 1 rank 3 micro-batches of 4.
    "zero2-adjusted": (
        [
            "parallelism.dp_mode=zero2",
            "data.batch_size=4",
            "data.global_batch_size=12",
            "data.adjust_batch_size=true",
        ],
        12,
    ),
}
# (micro-batch, accumulation steps) by layout and world size.
EXPECTED_SPLIT = {
    ("ddp", 2): (4, 2),
    ("ddp", 1): (4, 4),
    ("fsdp", 2): (4, 2),
    ("fsdp", 1): (4, 4),
    ("zero2-adjusted", 2): (3, 2),
    ("zero2-adjusted", 1): (4, 3),
}


class RecordingLog(EventLog):
    """The trainer's JSON events, kept instead of printed."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        if self.enabled:
            self.events.append({"event": event, **json.loads(json.dumps(fields, default=str))})


class RecordingSource:
    """Wraps the trainer's data source: which sample index each optimizer step asked for."""

    def __init__(self, inner: SampleSource, trainer: Trainer) -> None:
        self.inner, self.trainer = inner, trainer
        self.seen: list[tuple[int, int]] = []  # (step being trained, sample index)

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.append((self.trainer.progress.step + 1, index))
        return self.inner.sample(index)


def rng_fingerprint() -> dict[str, str]:
    """A digest of each global generator's state (Python, NumPy, torch CPU) on this rank."""
    states = {
        "python": repr(random.getstate()),
        "numpy": repr(np.random.get_state(legacy=True)),
        "torch": torch.get_rng_state().numpy().tobytes().hex(),
    }
    return {name: hashlib.sha256(state.encode()).hexdigest() for name, state in states.items()}


def run_phase(overrides: list[str], world_size: int, rank: int, steps: int, ckpt: str) -> dict[str, Any]:
    """The whole `Trainer.train()` loop to job.steps, resuming from `ckpt` when it holds a checkpoint."""
    config = load_config(
        None,
        [*TINY, *overrides, f"job.steps={steps}", "metrics.log_every=1", f"checkpoint.dir={ckpt}"],
        world_size,
    )
    env = DistEnv(rank, rank, world_size, 1, 0, world_size, "127.0.0.1", 0, 0, 60.0)
    log = RecordingLog(rank)
    trainer = Trainer(config, env, log=log)
    recorder = RecordingSource(trainer.data.source, trainer)
    trainer.data.source = recorder
    losses: dict[int, float] = {}
    reduce_loss = trainer.reduce_loss

    def recording_reduce_loss(local_loss: torch.Tensor) -> float:
        losses[trainer.progress.step] = value = reduce_loss(local_loss)
        return value

    trainer.reduce_loss = recording_reduce_loss  # type: ignore[method-assign]
    code = trainer.train()
    trainer.close()
    # Each parameter's optimizer step count this rank holds (LAMB keeps it as a Python int).
    optimizer = checkpointed_optimizer(trainer.app_state())
    steps_held = sorted({int(state["step"]) for state in optimizer.state.values()}) if optimizer else []
    steps_by_rank: list[Any] = [None] * world_size
    dist.all_gather_object(steps_by_rank, steps_held)
    rng_by_rank: list[Any] = [None] * world_size
    dist.all_gather_object(rng_by_rank, rng_fingerprint())
    samples_by_rank: list[Any] = [None] * world_size
    dist.all_gather_object(samples_by_rank, recorder.seen)
    by_step: dict[int, list[int]] = {}
    for seen in samples_by_rank:
        for step, index in seen:
            by_step.setdefault(step, []).append(index)
    return {
        "exit_code": code,
        "losses": losses,
        "samples": by_step,
        "events": log.events,
        "optimizer_steps": steps_by_rank,
        "rng": rng_by_rank,
    }


def _worker(
    rank: int, world_size: int, port: int, phases: dict[str, tuple[list[str], int, str]], out: str
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    )
    results = {
        name: run_phase(overrides, world_size, rank, steps, ckpt)
        for name, (overrides, steps, ckpt) in phases.items()
    }
    if rank == 0:
        torch.save(results, Path(out) / "results.pt")
    dist.destroy_process_group()


def run_group(world_size: int, phases: dict[str, tuple[list[str], int, str]]) -> dict[str, Any]:
    """Runs each (overrides, steps, checkpoint dir) one after another in one group of forked ranks."""
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _worker, args=(world_size, free_port(), phases, out), nprocs=world_size, start_method="fork"
        )
        results: dict[str, Any] = torch.load(Path(out) / "results.pt", weights_only=False)
    return results


def manifest(ckpt: Path, step: int) -> dict[str, Any]:
    folders = [p for p in ckpt.glob("step-*") if int(p.name.removeprefix("step-")) == step]
    assert len(folders) == 1, sorted(p.name for p in ckpt.iterdir())
    body: dict[str, Any] = json.loads((folders[0] / MANIFEST_NAME).read_text())
    return body


def event(result: dict[str, Any], name: str) -> dict[str, Any]:
    found = [e for e in result["events"] if e["event"] == name]
    assert len(found) == 1, [e["event"] for e in result["events"]]
    return found[0]


def test_resize_two_one_two_keeps_the_samples_and_the_loss_of_a_fixed_size_run(tmp_path: Path) -> None:
    first, second = RESIZED_AT
    ckpt = {name: str(tmp_path / name) for name in LAYOUTS}
    wide = run_group(
        2,
        {f"fixed-{name}": (overrides, STEPS, "''") for name, (overrides, _) in LAYOUTS.items()}
        | {f"before-{name}": (overrides, first, ckpt[name]) for name, (overrides, _) in LAYOUTS.items()},
    )
    narrow = run_group(
        1, {f"shrunk-{name}": (overrides, second, ckpt[name]) for name, (overrides, _) in LAYOUTS.items()}
    )
    grown = run_group(
        2, {f"grown-{name}": (overrides, STEPS, ckpt[name]) for name, (overrides, _) in LAYOUTS.items()}
    )
    report: list[str] = []
    for name, (_, global_batch) in LAYOUTS.items():
        fixed = wide[f"fixed-{name}"]
        phases = [(wide[f"before-{name}"], 2), (narrow[f"shrunk-{name}"], 1), (grown[f"grown-{name}"], 2)]
        losses: dict[int, float] = {}
        samples: dict[int, list[int]] = {}
        for index, (result, world) in enumerate(phases):
            assert result["exit_code"] == 0, name
            start = event(result, "start")
            micro, accumulation = EXPECTED_SPLIT[name, world]
            assert (start["world_size"], start["global_batch_size"]) == (world, global_batch), start
            assert (start["micro_batch_size"], start["grad_accumulation_steps"]) == (micro, accumulation)
            if index > 0:
                resumed = event(result, "resumed")
                written_by = phases[index - 1][1]
                assert (resumed["from_world_size"], resumed["from_global_batch_size"]) == (
                    written_by,
                    global_batch,
                ), resumed
            assert not set(result["losses"]) & set(losses), "a step was trained twice"
            losses |= result["losses"]
            samples |= result["samples"]
        written = manifest(Path(ckpt[name]), first)
        assert written["world_size"] == 2
        assert written["extra"]["batch"]["global_batch_size"] == global_batch
        assert manifest(Path(ckpt[name]), second)["world_size"] == 1

        assert sorted(samples) == sorted(fixed["samples"]) == list(range(1, STEPS + 1))
        for step in range(1, STEPS + 1):
            exact = list(range((step - 1) * global_batch, step * global_batch))
            assert sorted(fixed["samples"][step]) == exact, (name, step)
            assert sorted(samples[step]) == exact, (name, step)  # sorted: no index twice, none missing

        assert sorted(losses) == sorted(fixed["losses"]) == list(range(1, STEPS + 1))
        for step in range(1, first + 1):
            assert losses[step] == fixed["losses"][step], (name, step)  # same size, same run: bitwise
        worst = max(abs(losses[s] - fixed["losses"][s]) / abs(fixed["losses"][s]) for s in losses)
        report.append(f"{name}: largest relative loss difference {worst:.3g}")
        assert worst <= LOSS_TOLERANCE, (name, worst, losses, fixed["losses"])
    print("; ".join(report))


def test_zero1_lamb_shrink_restores_every_parameters_step_count(tmp_path: Path) -> None:
    """ZeRO-1 partitions the optimizer by parameter, and LAMB's per-parameter step is a Python int
    (not resharded by DCP): after 2 ranks -> 1 the one rank owns what both owned and must count every
    parameter's steps from the checkpoint, not from torch's state-dict probe step."""
    overrides = [
        "parallelism.dp_mode=zero1",
        "optimizer.name=lamb",
        "data.batch_size=4",
        "data.global_batch_size=16",
    ]
    ckpt = str(tmp_path / "ckpt")
    wide = run_group(2, {"fixed": (overrides, 3, "''"), "before": (overrides, 2, ckpt)})
    narrow = run_group(1, {"shrunk": (overrides, 3, ckpt)})
    assert wide["before"]["optimizer_steps"] == [[2], [2]]
    assert narrow["shrunk"]["exit_code"] == 0
    assert narrow["shrunk"]["optimizer_steps"] == [[3]]
    fixed, shrunk = wide["fixed"]["losses"], narrow["shrunk"]["losses"]
    assert sorted(shrunk) == [3]
    assert abs(shrunk[3] - fixed[3]) / abs(fixed[3]) <= LOSS_TOLERANCE, (shrunk, fixed)


def test_a_resize_without_a_global_batch_warns_that_the_global_batch_changed(tmp_path: Path) -> None:
    """Without data.global_batch_size the global batch follows dp: 2 ranks x 4 = 8, then 1 rank x 3 = 3.
    Refusing would turn the operator's resize into a failure, so the resume warns, naming both sizes
    and the fix; 8 samples are not a whole number of 3-sample steps, which it says too."""
    ckpt = str(tmp_path / "ckpt")
    wide = run_group(2, {"before": (["data.batch_size=4"], 1, ckpt)})
    narrow = run_group(1, {"shrunk": (["data.batch_size=3"], 2, ckpt)})
    assert wide["before"]["exit_code"] == narrow["shrunk"]["exit_code"] == 0
    assert not [e for e in wide["before"]["events"] if e["event"] == "warning"]
    warnings = [e for e in narrow["shrunk"]["events"] if e["event"] == "warning"]
    assert [w["reason"] for w in warnings] == ["global_batch_changed", "data_position_off_step_boundary"]
    changed, off = warnings
    assert (changed["from_global_batch_size"], changed["global_batch_size"]) == (8, 3), changed
    assert "data.global_batch_size = 8" in changed["message"]
    assert (off["consumed_samples"], off["global_batch_size"]) == (8, 3), off


def test_a_rank_new_after_a_grow_draws_its_own_random_stream(tmp_path: Path) -> None:
    """1 rank -> 2: the new rank 1 has no state of its own in the checkpoint. Taking rank 0's random
    generators would give every new rank rank 0's stream (the same dropout masks on every
    data-parallel rank); it reseeds instead, so no two ranks hold the same generator state."""
    ckpt = str(tmp_path / "ckpt")
    fixed = run_group(2, {"fixed": (["data.batch_size=4"], 2, "''")})["fixed"]
    run_group(1, {"before": (["data.batch_size=4"], 1, ckpt)})
    grown = run_group(2, {"grown": (["data.batch_size=4"], 2, ckpt)})["grown"]
    assert grown["exit_code"] == 0
    for phase, result in (("fixed", fixed), ("grown", grown)):
        first, second = result["rng"]
        for name in ("python", "numpy", "torch"):
            assert first[name] != second[name], (phase, name)


def test_the_start_warns_when_the_adjusted_micro_batch_is_under_half_the_batch_size() -> None:
    """11 sequences on one rank under data.batch_size = 8: only micro-batches of 1 split it."""
    overrides = ["data.batch_size=8", "data.global_batch_size=11", "data.adjust_batch_size=true"]
    result = run_group(1, {"tiny": (overrides, 1, "''")})["tiny"]
    assert result["exit_code"] == 0
    [warning] = [e for e in result["events"] if e["event"] == "warning"]
    assert warning["reason"] == "micro_batch_small", warning
    assert (warning["micro_batch_size"], warning["batch_size"]) == (1, 8)


def test_pipeline_dp_shrink_restores_each_stages_lamb_step_count(tmp_path: Path) -> None:
    """ZeRO-2 under pipeline parallelism, mesh (pp, dp, tp): at pp = 2, dp = 2 ranks 0-1 hold stage 0
    and ranks 2-3 stage 1; at dp = 1 rank 1 holds stage 1, whose LAMB steps only the old ranks 2 and 3
    saved (rank 1's file is stage 0's)."""
    overrides = [
        "parallelism.pp=2",
        "parallelism.dp_mode=zero2",
        "parallelism.pp_microbatches=2",
        "optimizer.name=lamb",
        "data.batch_size=4",
        "data.global_batch_size=16",
    ]
    ckpt = str(tmp_path / "ckpt")
    wide = run_group(4, {"before": (overrides, 2, ckpt)})
    narrow = run_group(2, {"shrunk": (overrides, 3, ckpt)})
    assert wide["before"]["optimizer_steps"] == [[2]] * 4
    assert narrow["shrunk"]["exit_code"] == 0
    assert narrow["shrunk"]["optimizer_steps"] == [[3], [3]]


def test_resuming_with_an_optimizer_whose_plain_state_the_checkpoint_lacks_is_refused(tmp_path: Path) -> None:
    """AdamW saves its step as a tensor, LAMB keeps a Python int: resumed with LAMB, nothing saved holds
    LAMB's step, and keeping the probe step's value would restart its bias correction silently."""
    ckpt = str(tmp_path / "ckpt")
    run_group(1, {"adamw": (["optimizer.name=adamw"], 1, ckpt)})
    with pytest.raises(mp.ProcessRaisedException, match="does not fit this run") as refused:
        run_group(1, {"lamb": (["optimizer.name=lamb"], 2, ckpt)})
    assert "optimizer.name" in str(refused.value) and "/step" in str(refused.value)
