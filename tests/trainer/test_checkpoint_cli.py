"""Exact resume through the real trainer CLI (`python -m phalanx_trainer`, two local ranks, gloo on CPU).

Uninterrupted run vs the same run SIGKILLed (every rank at once) and resumed: the losses after the
resume match the uninterrupted ones as logged, and the final checkpoints (model and optimizer state)
are bitwise identical. SIGTERM at a random step: exit 75, the emergency checkpoint is the last step
trained, the resumed run ends bitwise where the uninterrupted one did.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from phalanx.ports import free_port
from phalanx_trainer.checkpoint.safe_load import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    load_small_state,
    read_dcp_metadata,
)
from phalanx_trainer.stacks import STACK_DUMP_SIGNAL

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
STEPS = 24
INTERVAL = 4
TINY = [
    "job.torch_threads=1",
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=4",
    "model.seq_len=16",
    "optimizer.lr=0.003",
    "schedule.kind=cosine",
    "metrics.port=0",
    "metrics.log_every=1",
    f"job.steps={STEPS}",
    f"checkpoint.interval_steps={INTERVAL}",
]
LAYOUTS = {
    "ddp": ["parallelism.dp_mode=ddp"],
    "fsdp": ["parallelism.dp_mode=fsdp"],
    "tp": ["parallelism.tp=2"],
    "zero1": ["parallelism.dp_mode=zero1"],
}
# ZeRO-1 passes too (optimizer shards in the per-rank files, compared bitwise); it is left out of the
# default run for time: PHALANX_CHECKPOINT_CLI_LAYOUTS=ddp,fsdp,tp,zero1 runs it.
TESTED_LAYOUTS = os.environ.get("PHALANX_CHECKPOINT_CLI_LAYOUTS", "ddp,fsdp,tp").split(",")
EXIT_CHECKPOINTED_ON_PREEMPTION = 75


def start(layout: str, ckpt: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(NPROC_PER_NODE="2", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "trainer-image"), env.get("PYTHONPATH")) if p)
    env.pop("RANK", None)
    command = [sys.executable, "-m", "phalanx_trainer", *TINY, *LAYOUTS[layout], f"checkpoint.dir={ckpt}"]
    with open(log, "ab") as out:
        # Its own session: one killpg reaches the launcher and every rank.
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 150.0) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, STACK_DUMP_SIGNAL)  # every rank's stacks into the log: where it hangs
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"trainer did not finish in {timeout}s:\n{log.read_text()[-16000:]}")


def progress(log: Path) -> dict[int, str]:
    """step -> loss as logged (the trainer logs 5 decimals)."""
    steps: dict[int, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"progress"' in line:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # a line cut by SIGKILL
                continue
            steps[int(event["step"])] = repr(event["loss"])
    return steps


def wait_for_step(proc: subprocess.Popen[bytes], log: Path, step: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while max(progress(log), default=0) < step:
        assert proc.poll() is None, f"the trainer ended early:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, "timed out waiting for training progress"
        time.sleep(0.005)


def run_to_end(layout: str, ckpt: Path, log: Path) -> None:
    code = finish(start(layout, ckpt, log), log)
    assert code == 0, log.read_text()[-4000:]


def checkpoint_state(folder: Path) -> dict[str, Any]:
    """Everything a checkpoint holds, flattened: DCP tensors read whole with the safe reader (no process
    group needed), and every leaf of every rank's per-rank file (optimizer shards under ZeRO-1,
    scheduler, scaler, data position, random generators, progress)."""
    metadata = read_dcp_metadata(folder / ".metadata")
    state: dict[str, Any] = {
        key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }
    dcp_load(state, storage_reader=SafeFileSystemReader(folder), planner=SafeLoadPlanner(), no_dist=True)

    def flatten(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                flatten(f"{prefix}/{key}", value)
        elif isinstance(node, list | tuple):
            for index, value in enumerate(node):
                flatten(f"{prefix}/{index}", value)
        else:
            state[prefix] = node

    for path in sorted(folder.glob("rank-*.pt")):
        flatten(path.name, load_small_state(path.read_bytes()))
    return state


def committed(ckpt: Path) -> list[int]:
    return sorted(int(path.name.removeprefix("step-")) for path in ckpt.glob("step-*"))


# Everything is compared, generator states included: the trainer's DataLoader has its own
# generator, so seeding its workers draws nothing from the global stream.
NOT_COMPARED: tuple[str, ...] = ()


def assert_bitwise_equal(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert left.keys() == right.keys(), sorted(set(left) ^ set(right))[:5]
    left = {key: value for key, value in left.items() if not any(part in key for part in NOT_COMPARED)}
    assert any("exp_avg_sq" in key for key in left), "optimizer moments are not in the checkpoint"
    different = [
        key
        for key, value in left.items()
        if not (torch.equal(value, right[key]) if isinstance(value, torch.Tensor) else value == right[key])
    ]
    assert not different, f"not bitwise identical: {different[:5]}"


_references: dict[str, tuple[dict[int, str], dict[str, Any]]] = {}


def reference(layout: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, str], dict[str, Any]]:
    """The uninterrupted run of a layout (once per session)."""
    if layout not in _references:
        folder = tmp_path_factory.mktemp(f"reference-{layout}")
        log = folder / "log"
        run_to_end(layout, folder / "ckpt", log)
        losses = progress(log)
        assert sorted(losses) == list(range(1, STEPS + 1))
        _references[layout] = (losses, checkpoint_state(folder / "ckpt" / f"step-{STEPS:08d}"))
    return _references[layout]


@pytest.mark.parametrize("layout", TESTED_LAYOUTS)
def test_sigkill_of_every_rank_then_resume_is_bitwise_exact(
    layout: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    expected_losses, expected_final = reference(layout, tmp_path_factory)
    ckpt, first_log, second_log = tmp_path / "ckpt", tmp_path / "first", tmp_path / "second"
    proc = start(layout, ckpt, first_log)
    wait_for_step(proc, first_log, 2 * INTERVAL + 2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_after = max(progress(first_log))
    assert killed_after < STEPS, "the run ended before the kill: nothing was tested"
    newest = max(committed(ckpt))

    run_to_end(layout, ckpt, second_log)
    replayed = progress(second_log)
    assert min(replayed) == newest + 1, f"resumed at {min(replayed)}, newest committed checkpoint {newest}"
    assert sorted(replayed) == list(range(newest + 1, STEPS + 1))
    mismatched = {s: (replayed[s], expected_losses[s]) for s in replayed if replayed[s] != expected_losses[s]}
    assert not mismatched, f"losses after resume differ (resumed, uninterrupted): {mismatched}"
    assert_bitwise_equal(checkpoint_state(ckpt / f"step-{STEPS:08d}"), expected_final)


def test_sigterm_at_a_random_step_loses_no_step(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    expected_losses, expected_final = reference("ddp", tmp_path_factory)
    stop_at = random.randint(3, STEPS - 10)
    ckpt, first_log, second_log = tmp_path / "ckpt", tmp_path / "first", tmp_path / "second"
    proc = start("ddp", ckpt, first_log)
    wait_for_step(proc, first_log, stop_at)
    proc.send_signal(signal.SIGTERM)  # to the launcher, as the kubelet does; it forwards to the ranks
    code = finish(proc, first_log)
    assert code == EXIT_CHECKPOINTED_ON_PREEMPTION, first_log.read_text()[-4000:]
    last_trained = max(progress(first_log))
    assert max(committed(ckpt)) == last_trained, f"trained to {last_trained}, checkpoints {committed(ckpt)}"
    manifest = json.loads((ckpt / f"step-{last_trained:08d}" / "manifest.json").read_text())
    assert manifest["emergency"] or last_trained % INTERVAL == 0

    run_to_end("ddp", ckpt, second_log)
    replayed = progress(second_log)
    assert min(replayed) == last_trained + 1, "a step was lost or repeated"
    assert all(replayed[s] == expected_losses[s] for s in replayed)
    assert_bitwise_equal(checkpoint_state(ckpt / f"step-{STEPS:08d}"), expected_final)
