"""The imported heap is frozen before a worker restores (heap.py): a cold worker and the resident
launcher's forked ones. Each case runs in a process of its own: freezing is for the whole process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
# Importing torch and the trainer leaves ~340,000 objects; a fraction is enough to tell it was done.
AT_LEAST_FROZEN = 100_000


def frozen_counts(code: str) -> list[int]:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [int(line) for line in done.stdout.split()]


def test_a_worker_has_frozen_its_imports_when_it_builds_the_trainer() -> None:
    # Before: nothing was frozen, and the restore's full collections walked every imported object.
    (count,) = frozen_counts(
        "import gc, os\n"
        "import phalanx_trainer.train as train\n"
        "class Probe:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        print(gc.get_freeze_count(), flush=True)\n"
        "        os._exit(0)\n"
        "train.Trainer = Probe\n"
        "from phalanx_trainer.__main__ import run_worker\n"
        "from phalanx_trainer.config import load_config\n"
        "from phalanx_trainer.distenv import read_dist_env\n"
        "run_worker(load_config(None, [], 1), read_dist_env({}), {})\n"
    )
    assert count >= AT_LEAST_FROZEN


def test_the_resident_launchers_workers_inherit_its_frozen_heap() -> None:
    parent, child = frozen_counts(
        "import gc, os, sys\n"
        "from phalanx_trainer.resident import preload\n"
        "preload()\n"
        "print(gc.get_freeze_count(), flush=True)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print(gc.get_freeze_count(), flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "os._exit(0)\n"  # frozen objects outlive a normal exit: nanobind would report them as leaks
    )
    assert parent >= AT_LEAST_FROZEN and child >= AT_LEAST_FROZEN  # a few die in the child after the fork


def test_an_uncaught_error_after_the_freeze_ends_the_output_with_its_traceback() -> None:
    # The review's case: a worker that raises exits through the interpreter's shutdown, whose last
    # collection could not reach the frozen imports; nanobind then printed leak reports after the
    # traceback, pushing a device error out of the termination message's tail.
    done = subprocess.run(
        [sys.executable, "-c",
         "from phalanx_trainer.resident import preload\npreload()\nraise RuntimeError('the error to keep')"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "RuntimeError: the error to keep", done.stderr[-2000:]
