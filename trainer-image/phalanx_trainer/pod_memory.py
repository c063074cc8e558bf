"""The resident launcher's folder in the pod's memory, where its workers keep their state between
restart generations (checkpoint/memory.py). Torch-free: the launcher imports it before torch."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

# Set by the resident launcher for its workers (not part of the operator's contract); a value already
# in the launcher's environment is used as it is.
STATE_MEMORY_DIR_ENV = "PHALANX_STATE_MEMORY_DIR"
MEMORY_FILESYSTEM = Path("/dev/shm")  # a Memory emptyDir in every Phalanx pod (builders/pods.py)
FOLDER_PREFIX = "phalanx-state-"
CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")


def make_pod_folder(parent: Path = MEMORY_FILESYSTEM) -> Path | None:
    """A fresh folder for this pod incarnation (named with the launcher's pid), or None where there is
    no writable memory filesystem. Fresh, so that a replacement pod never finds a predecessor's
    snapshot where /dev/shm outlives pods (the development node runs every pod on one host)."""
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        return None
    sweep_orphans(parent)
    try:
        return Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-", dir=parent))
    except OSError:
        return None


def sweep_orphans(parent: Path) -> list[Path]:
    """Removes the folders of launchers that are gone (SIGKILLed: no `finally` ran); returns them."""
    removed: list[Path] = []
    for folder in parent.glob(f"{FOLDER_PREFIX}*"):
        owner = folder.name.removeprefix(FOLDER_PREFIX).split("-", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_pod_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def cgroup_memory_headroom(v2: Path = CGROUP_V2, v1: Path = CGROUP_V1_MEMORY) -> float:
    """Bytes this container may still use before its memory limit (tmpfs pages count against it);
    infinity when there is no limit or no cgroup to read."""
    for limit_file, usage_file in ((v2 / "memory.max", v2 / "memory.current"),
                                   (v1 / "memory.limit_in_bytes", v1 / "memory.usage_in_bytes")):  # fmt: skip
        try:
            limit, usage = limit_file.read_text().strip(), usage_file.read_text().strip()
        except OSError:
            continue
        if limit == "max" or not limit.isdigit() or not usage.isdigit():
            return math.inf
        if int(limit) >= 2**62:  # cgroup v1's "no limit"
            return math.inf
        return float(max(0, int(limit) - int(usage)))
    return math.inf
