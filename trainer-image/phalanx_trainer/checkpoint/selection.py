"""The resume rule: the newest checkpoint whose manifest, metadata and per-rank files all verify."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from phalanx_trainer.checkpoint.manifest import DCP_METADATA_NAME, Manifest, ManifestError, verify_folder
from phalanx_trainer.checkpoint.safe_load import load_small_state, read_dcp_metadata, referenced_files
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


def check_checkpoint(folder: Path, step: int) -> Manifest:
    """The manifest of a loadable checkpoint; raises ValueError (ManifestError, UnsafeCheckpointError)."""
    manifest = verify_folder(folder, expected_step=step)
    listed = {entry.path for entry in manifest.files}
    metadata = read_dcp_metadata(folder / DCP_METADATA_NAME)
    unlisted = sorted(referenced_files(metadata) - listed)
    if unlisted:
        raise ManifestError(f"DCP metadata points into files the manifest does not cover: {unlisted[:3]}")
    for rank in range(manifest.world_size):
        name = rank_file_name(rank)
        if name not in listed:
            raise ManifestError(f"{name} is not listed")
        load_small_state((folder / name).read_bytes())
    return manifest


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
