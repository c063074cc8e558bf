"""The checkpoint folder on disk: names, listing, commit by rename, retention. No torch here."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from phalanx_trainer.checkpoint.manifest import fsync_path

_STEP_RE = re.compile(r"^step-(\d{8,})$")
_TMP_RE = re.compile(r"^\.tmp-step-(\d{8,})-[0-9a-f]{32}$")
_TRASH_PREFIX = ".trash-"
# The storage probe's last figure (budget.reusable_probe): a file, so the job's next start finds it.
PROBE_RECORD_NAME = ".storage-probe.json"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def temporary_dir_name(step: int, token: str | None = None) -> str:
    return f".tmp-step-{step:08d}-{token or uuid.uuid4().hex}"


def probe_dir_name(token: str) -> str:
    """Where the storage probe writes: a trash name, so that a crash leaves it for remove_leftovers."""
    return f"{_TRASH_PREFIX}probe-{token}"


def read_probe_record(root: Path) -> dict[str, object] | None:
    """The probe record under root, or None when there is none or it is not a JSON object."""
    try:
        record = json.loads((root / PROBE_RECORD_NAME).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_probe_record(
    root: Path, bytes_per_second: float, world_size: int, ranks_per_node: int, measured: float
) -> None:
    """Replace the probe record whole (written aside, then renamed): a reader never sees half of it,
    and a failed write leaves nothing behind."""
    record = {"bytes_per_second": bytes_per_second, "world_size": world_size, "ranks_per_node": ranks_per_node,
              "measured": measured}  # fmt: skip
    aside = root / f"{PROBE_RECORD_NAME}.{uuid.uuid4().hex[:8]}"
    try:
        aside.write_text(json.dumps(record))
        os.replace(aside, root / PROBE_RECORD_NAME)
    finally:
        aside.unlink(missing_ok=True)


def parse_step_dir(name: str) -> int | None:
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def parse_temporary_dir(name: str) -> int | None:
    match = _TMP_RE.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Listing:
    complete: tuple[tuple[int, Path], ...]  # committed step folders, newest first
    temporaries: tuple[tuple[int, Path], ...]  # never committed, newest first


def list_checkpoints(root: Path) -> Listing:
    complete: list[tuple[int, Path]] = []
    temporaries: list[tuple[int, Path]] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return Listing((), ())
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        step = parse_step_dir(entry.name)
        if step is not None:
            complete.append((step, Path(entry.path)))
            continue
        step = parse_temporary_dir(entry.name)
        if step is not None:
            temporaries.append((step, Path(entry.path)))
    complete.sort(key=lambda item: item[0], reverse=True)
    temporaries.sort(key=lambda item: item[0], reverse=True)
    return Listing(tuple(complete), tuple(temporaries))


def retention_victims(
    complete_steps: list[int], keep: int, protected: set[int], invalid: Collection[int] = ()
) -> list[int]:
    """Steps to delete so that the newest `keep` valid checkpoints remain.

    Folders that fail verification (`invalid`) do not count towards `keep`: counting them would delete
    a loadable checkpoint and keep a useless one. They are deleted once a newer valid one exists; a
    damaged folder newer than every valid one stays for the resume to report. Never the newest valid
    one, never a protected one.
    """
    bad = set(invalid)
    valid = sorted(set(complete_steps) - bad, reverse=True)
    kept = set(valid[: max(keep, 1)])
    victims = [step for step in valid if step not in kept]
    if valid:
        victims += [step for step in bad & set(complete_steps) if step < valid[0]]
    return sorted((step for step in victims if step not in protected), reverse=True)


def remove_tree(path: Path) -> None:
    """Delete a folder so that a crash halfway never leaves something that looks complete."""
    trash = path.with_name(f"{_TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def remove_leftovers(root: Path) -> list[Path]:
    """Delete temporaries and trash from earlier runs (only call when no save is in flight)."""
    removed: list[Path] = []
    for _, path in list_checkpoints(root).temporaries:
        remove_tree(path)
        removed.append(path)
    for entry in os.scandir(root) if root.is_dir() else []:
        if entry.name.startswith(_TRASH_PREFIX) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def unseen_files(folder: Path, expected: dict[str, int], settle_seconds: float = 1.0) -> list[str]:
    """Names in `expected` (name -> size) that this process does not see in `folder` with that size.

    Looked at again for up to `settle_seconds`, in case a network filesystem shows another client's
    new files late.
    """
    deadline = time.monotonic() + settle_seconds
    while True:
        unseen = []
        for name, size in sorted(expected.items()):
            try:
                if (folder / name).stat().st_size != size:
                    unseen.append(name)
            except FileNotFoundError:
                unseen.append(name)
        if not unseen or time.monotonic() >= deadline:
            return unseen
        time.sleep(0.1)


def commit(temporary: Path, final: Path) -> None:
    """Publish a finished temporary folder under its final name, durably."""
    if final.exists():
        # An older, unusable copy of the same step (it failed verification): move it out of the way.
        remove_tree(final)
    os.rename(temporary, final)
    fsync_path(final.parent)
