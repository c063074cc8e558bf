"""The resume rule: the newest checkpoint whose manifest, metadata and per-rank files all verify.

At resume the work is split: rank 0 checks the structure (`check_checkpoint(..., check_digests=False)`:
manifest, sizes, metadata), then each file's digest is checked by one of the ranks that read it
(`files_read`, `assign_verification`). `latest_valid_checkpoint` does all of it in one process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import Metadata

from phalanx_trainer.checkpoint.manifest import DCP_METADATA_NAME, Manifest, ManifestError, verify_folder
from phalanx_trainer.checkpoint.safe_load import (
    SafeLoadPlanner,
    load_small_state,
    read_dcp_metadata,
    referenced_files,
)
from phalanx_trainer.checkpoint.store import list_checkpoints

RANK_FILE_FORMAT = "rank-{:05d}.pt"


def rank_file_name(rank: int) -> str:
    return RANK_FILE_FORMAT.format(rank)


@dataclass(frozen=True)
class Rejected:
    name: str
    step: int
    reason: str


@dataclass(frozen=True)
class Selection:
    path: Path | None
    manifest: Manifest | None
    rejected: tuple[Rejected, ...]  # newer than the chosen one (or all, when none is chosen)


def check_checkpoint(folder: Path, step: int, *, check_digests: bool = True) -> Manifest:
    """The manifest of a loadable checkpoint; raises ValueError (ManifestError, UnsafeCheckpointError).

    Without digests: manifest, sizes and metadata only, and the per-rank files are not loaded (each
    rank checks the files it reads).
    """
    manifest = verify_folder(folder, expected_step=step, check_digests=check_digests)
    listed = {entry.path for entry in manifest.files}
    metadata = read_dcp_metadata(folder / DCP_METADATA_NAME)
    unlisted = sorted(referenced_files(metadata) - listed)
    if unlisted:
        raise ManifestError(f"DCP metadata points into files the manifest does not cover: {unlisted[:3]}")
    for rank in range(manifest.world_size):
        name = rank_file_name(rank)
        if name not in listed:
            raise ManifestError(f"{name} is not listed")
        if check_digests:
            load_small_state((folder / name).read_bytes())
    return manifest


def next_candidate(root: Path, below: int | None) -> tuple[tuple[Path, Manifest] | None, list[Rejected]]:
    """The newest committed folder older than `below` whose structure checks out (no digests), and
    the ones skipped on the way."""
    rejected: list[Rejected] = []
    for step, folder in list_checkpoints(root).complete:
        if below is not None and step >= below:
            continue
        try:
            return (folder, check_checkpoint(folder, step, check_digests=False)), rejected
        except ValueError as error:
            rejected.append(Rejected(folder.name, step, str(error)))
    return None, rejected


def unfinished_newer_than(root: Path, floor: int) -> list[Rejected]:
    return [
        Rejected(folder.name, step, "temporary folder, never committed (save interrupted)")
        for step, folder in list_checkpoints(root).temporaries
        if step > floor
    ]


def files_read(
    folder: Path, metadata: Metadata, tensors: Mapping[str, torch.Tensor], rank_file: str
) -> set[str]:
    """The files a rank reads to load `tensors` (its DCP read plan), its per-rank file and .metadata.

    Raises what DCP's planner raises when the checkpoint lacks a tensor the rank holds.
    """
    planner = SafeLoadPlanner()
    planner.set_up_planner(dict(tensors), metadata, is_coordinator=False)
    storage = metadata.storage_data or {}
    names = {str(storage[item.storage_index].relative_path) for item in planner.create_local_plan().items}
    return names | {rank_file, DCP_METADATA_NAME}


def assign_verification(reads: list[set[str]], sizes: Mapping[str, int]) -> list[set[str]]:
    """Which rank hashes which file: each file once, by one of the ranks that read it, largest files
    first, each to the reader with the fewest bytes so far (ties: the lowest rank)."""
    assigned: list[set[str]] = [set() for _ in reads]
    load = [0] * len(reads)
    every = set().union(*reads) if reads else set()
    for name in sorted(every, key=lambda item: (-sizes.get(item, 0), item)):
        readers = [rank for rank, names in enumerate(reads) if name in names]
        chosen = min(readers, key=lambda rank: (load[rank], rank))
        assigned[chosen].add(name)
        load[chosen] += sizes.get(name, 0)
    return assigned


def latest_valid_checkpoint(root: Path) -> Selection:
    listing = list_checkpoints(root)
    rejected: list[Rejected] = []
    chosen: tuple[Path, Manifest] | None = None
    for step, folder in listing.complete:
        try:
            chosen = (folder, check_checkpoint(folder, step))
            break
        except ValueError as error:  # ManifestError and UnsafeCheckpointError are ValueErrors
            rejected.append(Rejected(folder.name, step, str(error)))
    floor = chosen[1].step if chosen else -1
    for step, folder in listing.temporaries:
        if step > floor:
            rejected.append(
                Rejected(folder.name, step, "temporary folder, never committed (save interrupted)")
            )
    rejected.sort(key=lambda item: item.step, reverse=True)
    if chosen is None:
        return Selection(None, None, tuple(rejected))
    return Selection(chosen[0], chosen[1], tuple(rejected))
