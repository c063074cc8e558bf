"""The CRD is generated from the models; a stale committed copy fails the check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def test_the_pod_template_is_kubernetes_own_schema_checked_at_admission() -> None:
    crd = build_crd()
    template = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "template"
    ]
    pod_spec = template["properties"]["spec"]
    assert {"nodeSelector", "tolerations", "affinity", "schedulingGates", "volumes", "initContainers"} <= set(
        pod_spec["properties"]
    )
    container = pod_spec["properties"]["containers"]["items"]
    assert container["properties"]["ports"]["items"]["properties"]["containerPort"]["type"] == "integer"
    # The project's own rules stay on top of Kubernetes' schema.
    assert container["properties"]["name"]["maxLength"] == 63
    assert any("trainer" in r["rule"] for r in pod_spec["x-kubernetes-validations"])
    requests = container["properties"]["resources"]["properties"]["requests"]["additionalProperties"]
    assert requests["x-kubernetes-int-or-string"] is True
    # Only labels and annotations of embedded metadata; nothing passes through unchecked.
    assert set(template["properties"]["metadata"]["properties"]) == {"labels", "annotations"}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            assert "$ref" not in node and not node.get("x-kubernetes-preserve-unknown-fields"), path
            assert not isinstance(node.get("type"), list), path
            assert node.get("additionalProperties") is not False, path
            for key, child in node.items():
                walk(child, f"{path}.{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{path}[{i}]")

    walk(template, "template")


def test_the_crd_stays_well_inside_the_api_servers_object_size_limit() -> None:
    # etcd takes 1.5 MiB per object; client-side `kubectl apply` would need < 256 KiB of annotation,
    # so the docs and tests apply the CRD server-side.
    assert len(json.dumps(build_crd(), separators=(",", ":"))) < 400_000
