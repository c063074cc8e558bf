"""The resident launcher's folder in the pod's memory, where its workers keep their state between
restart generations (checkpoint/memory.py). Torch-free: the launcher imports it before torch."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Set by the resident launcher for its workers (not part of the operator's contract); a value already
# in the launcher's environment is used as it is.
STATE_MEMORY_DIR_ENV = "PHALANX_STATE_MEMORY_DIR"
MEMORY_FILESYSTEM = Path("/dev/shm")  # a Memory emptyDir in every Phalanx pod (builders/pods.py)


def make_pod_folder(parent: Path = MEMORY_FILESYSTEM) -> Path | None:
    """A fresh folder for this pod incarnation, or None where there is no writable memory filesystem.

    Fresh, so that a replacement pod never finds a predecessor's snapshot where /dev/shm outlives pods
    (the development node runs every pod's processes on one host)."""
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        return None
    try:
        return Path(tempfile.mkdtemp(prefix="phalanx-state-", dir=parent))
    except OSError:
        return None


def remove_pod_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
