"""The CRD is generated from the models; a stale committed copy fails the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.api import generate
from phalanx.api.crd import build_crd

pytestmark = pytest.mark.unit


def test_committed_files_are_fresh() -> None:
    assert generate.main(["--check"]) == 0


def test_check_fails_when_a_copy_is_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path, text in generate.rendered_files().items():
        target = tmp_path / path.relative_to(generate.REPO_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    monkeypatch.setattr(generate, "REPO_ROOT", tmp_path)
    assert generate.main(["--check"]) == 0
    chart_copy = tmp_path / "charts" / "phalanx" / "crds" / generate.CRD_FILE
    chart_copy.write_text(chart_copy.read_text().replace("WORLD_SIZE", "WORLDSIZE"))
    assert generate.main(["--check"]) == 1


def test_schema_is_structural_with_descriptions_and_status_subresource() -> None:
    crd = build_crd()
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert crd["spec"]["names"]["shortNames"] == ["tj"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "WORLD_SIZE" in spec["properties"]["replicas"]["description"]
    assert spec["properties"]["replicas"]["minimum"] == 1

    def walk(node: dict, path: str) -> None:  # type: ignore[type-arg]
        if "properties" in node:
            assert node.get("type") == "object", path
            for key, child in node["properties"].items():
                assert "description" in child or key in ("metadata",), f"{path}.{key} lacks a description"
                walk(child, f"{path}.{key}")
        if "items" in node:
            walk(node["items"], f"{path}[]")

    walk(spec, "spec")


def test_printer_columns_cover_phase_ready_restarts_progress_age() -> None:
    names = [c["name"] for c in build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert {"Phase", "Ready", "Restarts", "Progress", "Age"} <= set(names)
