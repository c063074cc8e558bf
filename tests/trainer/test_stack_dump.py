"""`kill -USR1` on a trainer pod's launcher writes every rank's thread stacks to the log, and training
goes on (phalanx_trainer/stacks.py): the local launcher and the resident one (restart in place)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phalanx.ports import free_port
from tests.trainer.test_trainer_entry import SMALL

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
ARGS = [*SMALL, "metrics.port=0", "job.steps=100000"]  # runs until killed
LAUNCHERS = {
    "local": {"NPROC_PER_NODE": "2"},
    "resident": {"NPROC_PER_NODE": "2", "NNODES": "1", "PHALANX_RESTART_IN_PLACE": "true"},
}


def last_step(stdout: Path) -> int:
    steps = [0]
    for line in stdout.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"progress"' in line:
            try:
                steps.append(int(json.loads(line)["step"]))
            except json.JSONDecodeError:
                continue
    return max(steps)


def wait_until(condition: object, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    while not condition():  # type: ignore[operator]
        assert process.poll() is None, (
            f"the trainer exited ({process.returncode}):\n{log.read_text()[-4000:]}"
        )
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.1)


HEADER = re.compile(r"^phalanx-trainer: stacks of local rank (\d+) \(pid (\d+)\):$", re.MULTILINE)


def dumps(text: str) -> list[tuple[int, int, str]]:
    """(local rank, pid, what followed its line up to the next one) per line the launcher wrote."""
    heads = list(HEADER.finditer(text))
    ends = [h.start() for h in heads[1:]] + ([len(text)] if heads else [])
    return [(int(h[1]), int(h[2]), text[h.end() : end]) for h, end in zip(heads, ends, strict=True)]


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^PPid:\s+(\d+)$", status, re.MULTILINE)[1])  # type: ignore[index]


def children_of(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.parametrize("when", ["training", "starting"])
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_sigusr1_to_the_launcher_dumps_every_ranks_stacks_and_training_goes_on(
    launcher: str, when: str, tmp_path: Path
) -> None:
    """`starting`: the signal comes while the workers still import (until they can dump, its
    default action would kill them: they start with it blocked, and dump once they can)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(
        PYTHONPATH=str(REPO / "trainer-image"),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        GLOO_SOCKET_IFNAME="lo",
        PHALANX_CONTROL_PORT=str(free_port()),
        **LAUNCHERS[launcher],
    )
    stdout, stderr = tmp_path / "out", tmp_path / "err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "phalanx_trainer", *ARGS],
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,  # one killpg ends the launcher and its workers
        )
    try:
        if when == "training":
            wait_until(lambda: last_step(stdout) >= 3, "step 3", process, stderr)
        else:
            wait_until(lambda: len(children_of(process.pid)) == 2, "the workers started", process, stderr)
        os.kill(process.pid, signal.SIGUSR1)  # the launcher only: it passes the signal on
        wait_until(lambda: len(dumps(stderr.read_text())) == 2 and all(d[2] for d in dumps(stderr.read_text())),
                   "a dump from each rank", process, stderr)  # fmt: skip
        workers = {pid for _, pid, _ in dumps(stderr.read_text())}
        assert all(parent_of(pid) == process.pid for pid in workers), workers  # the launcher's workers
        dumped_at = last_step(stdout)
        wait_until(lambda: last_step(stdout) >= dumped_at + 3, "steps after the dump", process, stderr)
        found = dumps(stderr.read_text())
        assert sorted(rank for rank, _, _ in found) == [0, 1] and len(workers) == 2, found
        for _, _, dump in found:  # each under its own line, whole: the main thread's training loop
            assert "(most recent call first)" in dump, dump
            if when == "training":
                assert "phalanx_trainer/train.py" in dump, dump
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
