"""The CRD is generated from the models; a stale committed copy fails the check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx import constants as c
from phalanx.api import generate
from phalanx.api.crd import build_crd, expected_digest, schema_digest, stale_crd_message

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


def test_the_committed_crd_carries_the_digest_of_its_own_spec() -> None:
    committed = yaml.safe_load((generate.REPO_ROOT / "crds" / generate.CRD_FILE).read_text())
    digest = committed["metadata"]["annotations"][c.ANNOTATION_SCHEMA_DIGEST]
    assert digest == schema_digest(committed["spec"]) == schema_digest(build_crd()["spec"])
    assert stale_crd_message(committed, expected_digest()) is None


def test_an_older_crd_is_named_with_the_fix() -> None:
    older = build_crd()
    older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"].pop(
        "inPlace"
    )
    older["metadata"]["annotations"][c.ANNOTATION_SCHEMA_DIGEST] = schema_digest(older["spec"])
    message = stale_crd_message(older, expected_digest())
    assert message is not None and "kubectl apply --server-side -f charts/phalanx/crds/" in message
    assert f"schema digest {schema_digest(older['spec'])}" in message
    unannotated = build_crd()
    del unannotated["metadata"]["annotations"]
    assert "schema digest absent" in (stale_crd_message(unannotated, expected_digest()) or "")
    assert "is not installed" in (stale_crd_message(None, expected_digest()) or "")


def test_the_start_up_check_sets_the_gauge_and_logs_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    from phalanx import handlers, metrics

    class Api:
        def __init__(self, crd: dict[str, Any] | None) -> None:
            self.crd = crd

        def trainingjob_crd(self) -> dict[str, Any] | None:
            return self.crd

    older = build_crd()
    older["metadata"]["annotations"][c.ANNOTATION_SCHEMA_DIGEST] = "0123456789abcdef"
    expected = schema_digest(build_crd()["spec"])

    def series() -> list[dict[str, str]]:
        [family] = [f for f in metrics.REGISTRY.collect() if f.name == "phalanx_crd_schema_info"]
        return [s.labels for s in family.samples if s.value == 1]

    handlers.check_crd(Api(older))  # type: ignore[arg-type]
    assert series() == [{"current": "false", "installed": "0123456789abcdef", "expected": expected}]
    assert any(r.levelname == "ERROR" and "charts/phalanx/crds/" in r.getMessage() for r in caplog.records)
    handlers.check_crd(Api(build_crd()))  # type: ignore[arg-type]
    assert series() == [{"current": "true", "installed": expected, "expected": expected}]
