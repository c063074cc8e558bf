"""The manifest that commits a checkpoint: what was written, by whom, with sizes and SHA-256 digests.

Pure functions over a directory; the manifest is the last file written before the rename, so a
checkpoint without a manifest that verifies was never complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
DCP_METADATA_NAME = ".metadata"
FORMAT_NAME = "phalanx-checkpoint"
FORMAT_VERSION = 1
_HASH_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the checkpoint folder, no separators
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    layout: dict[str, Any]
    created: str  # RFC 3339, UTC
    files: tuple[FileEntry, ...]
    emergency: bool = False
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        body = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "step": self.step,
            "world_size": self.world_size,
            "layout": self.layout,
            "created": self.created,
            "emergency": self.emergency,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            "extra": self.extra,
        }
        return json.dumps(body, indent=1, sort_keys=True)


class ManifestError(ValueError):
    """The manifest is missing, malformed, or does not match the files."""


def sha256_file(path: Path) -> str:
    """Digest of a file, read in large chunks (hashlib drops the GIL on each chunk)."""
    digest = hashlib.sha256()
    buffer = bytearray(_HASH_CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            count = handle.readinto(view)
            if not count:
                break
            digest.update(view[:count])
    return digest.hexdigest()


def describe_file(folder: Path, name: str) -> FileEntry:
    path = folder / name
    return FileEntry(path=name, size=path.stat().st_size, sha256=sha256_file(path))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ManifestError(message)


def _safe_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def parse_manifest(text: str) -> Manifest:
    """Parse and validate the shape of a manifest; raises ManifestError with the first problem found."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError as error:
        raise ManifestError(f"manifest is not JSON: {error.msg} at offset {error.pos}") from None
    _require(isinstance(body, dict), "manifest is not a JSON object")
    _require(body.get("format") == FORMAT_NAME, f"manifest format is not {FORMAT_NAME!r}")
    version = body.get("format_version")
    _require(version == FORMAT_VERSION, f"unsupported manifest format_version {version!r}")
    step, world_size = body.get("step"), body.get("world_size")
    _require(isinstance(step, int) and not isinstance(step, bool) and step >= 0, "bad step")
    _require(
        isinstance(world_size, int) and not isinstance(world_size, bool) and world_size >= 1, "bad world_size"
    )
    layout, created, emergency = body.get("layout", {}), body.get("created"), body.get("emergency", False)
    _require(isinstance(layout, dict), "layout is not an object")
    _require(isinstance(created, str), "created is not a string")
    _require(isinstance(emergency, bool), "emergency is not a boolean")
    raw_files = body.get("files")
    _require(isinstance(raw_files, list) and len(raw_files) > 0, "files is not a non-empty list")
    files: list[FileEntry] = []
    for raw in raw_files:
        _require(isinstance(raw, dict), "file entry is not an object")
        name, size, digest = raw.get("path"), raw.get("size"), raw.get("sha256")
        _require(_safe_name(name), f"unsafe file name {name!r}")
        _require(isinstance(size, int) and not isinstance(size, bool) and size >= 0, f"bad size for {name}")
        _require(
            isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest),
            f"bad sha256 for {name}",
        )
        files.append(FileEntry(path=str(name), size=int(size), sha256=str(digest)))
    names = [f.path for f in files]
    _require(len(set(names)) == len(names), "duplicate file names")
    _require(DCP_METADATA_NAME in names, f"{DCP_METADATA_NAME} is not listed")
    extra = body.get("extra", {})
    _require(isinstance(extra, dict), "extra is not an object")
    return Manifest(
        step=int(step),
        world_size=int(world_size),
        layout=dict(layout),
        created=created,
        files=tuple(files),
        emergency=emergency,
        format_version=FORMAT_VERSION,
        extra=dict(extra),
    )


def verify_folder(folder: Path, *, expected_step: int | None = None, check_digests: bool = True) -> Manifest:
    """The folder's manifest if every listed file is present with its size and digest; else ManifestError."""
    manifest_path = folder / MANIFEST_NAME
    try:
        text = manifest_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError("manifest.json is missing") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ManifestError(f"manifest.json unreadable: {error}") from None
    manifest = parse_manifest(text)
    if expected_step is not None:
        _require(
            manifest.step == expected_step, f"manifest step {manifest.step} != folder step {expected_step}"
        )
    for entry in manifest.files:
        path = folder / entry.path
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise ManifestError(f"{entry.path} is missing") from None
        _require(size == entry.size, f"{entry.path} has {size} bytes, manifest says {entry.size}")
    if check_digests:
        verify_digests(folder, manifest, {entry.path for entry in manifest.files})
    return manifest


def verify_digests(folder: Path, manifest: Manifest, names: set[str], *, workers: int = 1) -> None:
    """Each named file's SHA-256 against the manifest, up to `workers` files at once (hashlib drops
    the GIL); ManifestError names the first file, in name order, that differs."""
    listed = {entry.path: entry for entry in manifest.files}
    ordered = sorted(names)
    for name in ordered:
        _require(name in listed, f"{name} is not listed")
    with ThreadPoolExecutor(max(1, min(workers, len(ordered) or 1)), "checkpoint-hash") as pool:
        digests = list(pool.map(lambda name: sha256_file(folder / name), ordered))
    for name, actual in zip(ordered, digests, strict=True):
        _require(actual == listed[name].sha256, f"{name} sha256 mismatch (content changed or damaged)")


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory fsync makes a rename durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write manifest.json durably: temporary name, fsync, rename, fsync the folder."""
    staging = folder / (MANIFEST_NAME + ".partial")
    with open(staging, "w", encoding="utf-8") as handle:
        handle.write(manifest.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staging, folder / MANIFEST_NAME)
    fsync_path(folder)
