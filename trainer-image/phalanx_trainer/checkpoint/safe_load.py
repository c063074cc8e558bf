"""Loading that never runs code from a checkpoint file.

DCP reads its `.metadata` with plain `pickle.load` and any non-tensor entry with
`torch.load(weights_only=False)`. We read `.metadata` with an unpickler that only builds the DCP metadata
records, refuse non-tensor DCP entries (our saves never write them), and read our own small per-rank
files with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_METADATA_GLOBALS: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"}),
    "collections": frozenset({"OrderedDict"}),
}


class UnsafeCheckpointError(ValueError):
    """A checkpoint file asks to build something other than plain data."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name == "Size":
            return torch.Size
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if name in _METADATA_GLOBALS.get(module, frozenset()):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(f"DCP metadata refers to {module}.{name}, which is not allowed")


def read_dcp_metadata(path: Path) -> Metadata:
    """Parse a DCP `.metadata` file without running code; raises UnsafeCheckpointError or ValueError."""
    with open(path, "rb") as handle:
        try:
            metadata = _MetadataUnpickler(handle).load()
        except UnsafeCheckpointError:
            raise
        except Exception as error:  # a damaged pickle raises many kinds of errors
            raise ValueError(f".metadata does not parse: {type(error).__name__}: {error}") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f".metadata holds {type(metadata).__name__}, not DCP Metadata")
    byte_entries = [
        key for key, value in metadata.state_dict_metadata.items() if isinstance(value, BytesStorageMetadata)
    ]
    if byte_entries:
        raise UnsafeCheckpointError(
            f".metadata declares pickled entries {byte_entries[:3]} (never written by us)"
        )
    return metadata


def referenced_files(metadata: Metadata) -> set[str]:
    """Files the DCP metadata points into (each must be covered by the manifest)."""
    storage = metadata.storage_data or {}
    return {str(getattr(info, "relative_path", "")) for info in storage.values()}


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata read is the restricted one above."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise UnsafeCheckpointError("per-rank DCP metadata is not used by Phalanx checkpoints")
        metadata = read_dcp_metadata(Path(self.path) / ".metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Refuses pickled (non-tensor) entries instead of unpickling them."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise UnsafeCheckpointError(f"refusing pickled DCP entry {read_item.dest_index.fqn}")


def load_small_state(data: bytes) -> dict[str, Any]:
    """Our per-rank state file: tensors, numbers, strings, lists, tuples, dicts only."""
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafeCheckpointError(f"refused by weights_only: {str(error).splitlines()[0]}") from None
    except Exception as error:  # a damaged zip archive raises RuntimeError and others
        raise ValueError(f"per-rank state does not load: {type(error).__name__}: {error}") from None
    if not isinstance(loaded, dict):
        raise UnsafeCheckpointError(f"per-rank state is {type(loaded).__name__}, expected dict")
    return loaded


def dump_small_state(state: dict[str, Any]) -> bytes:
    """Serialize per-rank state, failing now (not at resume) if it would not load under weights_only."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).splitlines()[0]
        raise TypeError(f"checkpoint state must be loadable with weights_only=True: {first}") from None
    return data
