"""Manifest parsing and verification, folder names, retention: pure functions over small folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx_trainer.checkpoint.manifest import (
    Manifest,
    ManifestError,
    describe_file,
    parse_manifest,
    verify_folder,
    write_manifest,
)
from phalanx_trainer.checkpoint.store import (
    list_checkpoints,
    parse_step_dir,
    parse_temporary_dir,
    retention_victims,
    step_dir_name,
    temporary_dir_name,
)

pytestmark = pytest.mark.unit


def make_checkpoint(folder: Path, step: int = 7) -> Manifest:
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"metadata bytes")
    (folder / "__0_0.distcp").write_bytes(bytes(range(256)) * 64)
    files = tuple(describe_file(folder, name) for name in (".metadata", "__0_0.distcp"))
    manifest = Manifest(
        step=step, world_size=1, layout={"kind": "single"}, created="2026-01-01T00:00:00Z", files=files
    )
    write_manifest(folder, manifest)
    return manifest


def test_a_written_manifest_verifies_and_round_trips(tmp_path: Path) -> None:
    written = make_checkpoint(tmp_path / "c")
    assert verify_folder(tmp_path / "c", expected_step=7) == written
    body = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert body["format_version"] == 1 and body["step"] == 7 and body["world_size"] == 1
    assert {f["path"] for f in body["files"]} == {".metadata", "__0_0.distcp"}
    assert all(len(f["sha256"]) == 64 for f in body["files"])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            lambda d: (d / "__0_0.distcp").write_bytes((d / "__0_0.distcp").read_bytes()[:100]),
            "has 100 bytes",
        ),
        (lambda d: flip_byte(d / "__0_0.distcp", 5000), "sha256 mismatch"),
        (lambda d: (d / ".metadata").unlink(), ".metadata is missing"),
        (lambda d: (d / "manifest.json").unlink(), "manifest.json is missing"),
        (lambda d: (d / "manifest.json").write_text('{"format": "phalanx-checkpoint"'), "not JSON"),
    ],
    ids=["truncated", "flipped-byte", "missing-metadata", "missing-manifest", "cut-manifest"],
)
def test_each_kind_of_damage_is_named(tmp_path: Path, damage: object, reason: str) -> None:
    folder = tmp_path / "c"
    make_checkpoint(folder)
    damage(folder)  # type: ignore[operator]
    with pytest.raises(ManifestError, match=reason):
        verify_folder(folder, expected_step=7)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_manifest_for_another_step_is_rejected(tmp_path: Path) -> None:
    make_checkpoint(tmp_path / "c", step=7)
    with pytest.raises(ManifestError, match="manifest step 7 != folder step 8"):
        verify_folder(tmp_path / "c", expected_step=8)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b.update(format_version=2), "format_version"),
        (lambda b: b.update(step=-1), "bad step"),
        (lambda b: b.update(world_size=0), "bad world_size"),
        (
            lambda b: b["files"].append({"path": "../escape", "size": 1, "sha256": "0" * 64}),
            "unsafe file name",
        ),
        (lambda b: b["files"].append(dict(b["files"][0])), "duplicate"),
        (lambda b: b["files"][0].update(sha256="xyz"), "bad sha256"),
        (
            lambda b: b.update(files=[f for f in b["files"] if f["path"] != ".metadata"]),
            ".metadata is not listed",
        ),
        (lambda b: b.update(format="other"), "format"),
    ],
)
def test_malformed_manifests_are_rejected_with_a_reason(tmp_path: Path, mutate: object, reason: str) -> None:
    make_checkpoint(tmp_path / "c")
    body = json.loads((tmp_path / "c" / "manifest.json").read_text())
    mutate(body)  # type: ignore[operator]
    with pytest.raises(ManifestError, match=reason):
        parse_manifest(json.dumps(body))


def test_folder_names_parse_and_listing_orders_newest_first(tmp_path: Path) -> None:
    assert step_dir_name(42) == "step-00000042" and parse_step_dir("step-00000042") == 42
    token = "ab" * 16
    assert temporary_dir_name(42, token) == f".tmp-step-00000042-{token}"
    assert parse_temporary_dir(f".tmp-step-00000042-{token}") == 42
    assert parse_step_dir("step-42") is None and parse_temporary_dir(".tmp-step-00000042-short") is None
    for name in ("step-00000002", "step-00000010", f".tmp-step-00000012-{token}", "unrelated"):
        (tmp_path / name).mkdir()
    listing = list_checkpoints(tmp_path)
    assert [step for step, _ in listing.complete] == [10, 2]
    assert [step for step, _ in listing.temporaries] == [12]


def test_retention_keeps_the_newest_and_what_is_protected() -> None:
    assert retention_victims([1, 2, 3, 4, 5], keep=2, protected=set()) == [3, 2, 1]
    assert retention_victims([1, 2, 3], keep=0, protected=set()) == [2, 1], "the newest is never deleted"
    assert retention_victims([1, 2, 3], keep=1, protected={2}) == [1]
    assert retention_victims([], keep=2, protected=set()) == []


def test_folders_that_fail_verification_do_not_count_towards_keep() -> None:
    # step 4 is damaged: the two kept are 5 and 3, and the damaged one goes too.
    assert retention_victims([1, 2, 3, 4, 5], keep=2, protected=set(), invalid={4}) == [4, 2, 1]
    # A damaged folder newer than every valid one is left for the resume to report.
    assert retention_victims([1, 2, 3, 4], keep=2, protected=set(), invalid={4}) == [1]
    assert retention_victims([1, 2], keep=2, protected=set(), invalid={1, 2}) == []


def test_each_file_read_is_hashed_once_by_one_of_its_readers() -> None:
    from phalanx_trainer.checkpoint.selection import assign_verification

    sizes = {"__0_0.distcp": 100, "__1_0.distcp": 100, "rank-00000.pt": 1, "rank-00001.pt": 1, ".metadata": 5}
    reads = [
        {"__0_0.distcp", "rank-00000.pt", ".metadata"},
        {"__0_0.distcp", "__1_0.distcp", "rank-00001.pt", ".metadata"},
    ]
    assigned = assign_verification(reads, sizes)
    assert set().union(*assigned) == set(sizes)
    assert sum(len(names) for names in assigned) == len(sizes), "a file is hashed twice"
    assert all(names <= read for names, read in zip(assigned, reads, strict=True)), "hashed by a non-reader"
    # __0_0.distcp is read by both ranks and hashed once; each per-rank file by its own rank.
    assert assigned[0] >= {"__0_0.distcp", "rank-00000.pt"} and assigned[1] >= {
        "__1_0.distcp",
        "rank-00001.pt",
    }
