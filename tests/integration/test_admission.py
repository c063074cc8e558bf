"""Bad TrainingJobs are rejected by the API server at admission, with a message naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster
from tests.jobs import training_job

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data"
INVALID = sorted((DATA / "invalid").glob("*.yaml"))
VALID = sorted((DATA / "valid").glob("*.yaml"))


def expected_message(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <message fragment>'"
    return first.removeprefix("# expect: ")


def test_the_invalid_corpus_is_large_enough() -> None:
    assert len(INVALID) >= 25


@pytest.mark.parametrize("manifest", INVALID, ids=lambda p: p.stem)
def test_invalid_manifest_is_rejected_naming_the_field(
    cluster: Cluster, crd_installed: None, manifest: Path
) -> None:
    # Server-side dry run: full admission (schema, CEL, field validation), nothing stored.
    result = cluster.kubectl("create", "--dry-run=server", "-n", "default", "-f", str(manifest), check=False)
    assert result.returncode != 0, f"{manifest.name} was accepted"
    assert expected_message(manifest) in result.stderr, result.stderr


@pytest.mark.parametrize("manifest", VALID, ids=lambda p: p.stem)
def test_valid_variant_is_accepted(cluster: Cluster, crd_installed: None, manifest: Path) -> None:
    result = cluster.kubectl("create", "--dry-run=server", "-n", "default", "-f", str(manifest), check=False)
    assert result.returncode == 0, result.stderr


def test_defaults_are_applied_by_the_api_server(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    cluster.apply(training_job("defaults", replicas=2), namespace)
    spec = cluster.get_json("tj", "defaults", "-n", namespace)["spec"]
    assert spec["rendezvous"] == {"port": 29500, "timeoutSeconds": 600}
    assert spec["runPolicy"]["backoffLimit"] == 3 and spec["runPolicy"]["terminationGracePeriodSeconds"] == 60
    assert spec["scheduling"]["provider"] == "builtin" and spec["scheduling"]["gang"]["timeoutSeconds"] == 300
    assert spec["checkpoint"] == {"path": "/checkpoints", "keep": 3}


def test_shape_fields_are_immutable_unless_suspended(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    cluster.apply(training_job("frozen", replicas=2), namespace)
    change = cluster.kubectl("patch", "tj", "frozen", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":3}}',
                             check=False)  # fmt: skip
    assert change.returncode != 0
    assert "spec.replicas can change only while the job is suspended" in change.stderr
    cluster.kubectl("patch", "tj", "frozen", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"replicas":3,"runPolicy":{"suspend":true}}}')  # fmt: skip
    assert cluster.get_json("tj", "frozen", "-n", namespace)["spec"]["replicas"] == 3


def test_replicas_cannot_be_added_to_an_active_job_created_without_them(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    # From the review of elastic jobs: once replicas lost its schema default, a job stored without
    # it could be given replicas while running (a new WORLD_SIZE, or pods hidden past the size).
    job = training_job("derived", replicas=1)
    del job["spec"]["replicas"]
    cluster.apply(job, namespace)
    result = patch_job(cluster, namespace, "derived", {"spec": {"replicas": 4}})
    assert result.returncode != 0
    assert "spec.replicas can change only while the job is suspended" in result.stderr
    elastic = training_job("elastic-derived", replicas=1, elastic={"minReplicas": 1, "maxReplicas": 4})
    del elastic["spec"]["replicas"]
    cluster.apply(elastic, namespace)
    result = patch_job(cluster, namespace, "elastic-derived", {"spec": {"replicas": 2}})
    assert result.returncode != 0 and "spec.replicas can change only" in result.stderr


def test_an_elastic_job_cannot_ask_for_a_required_topology(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    # The room an elastic attempt is sized by ignores the domains: a Required gang sized across two
    # racks could never fit (from the review). Preferred only orders the placement.
    job = training_job("racked", replicas=2, elastic={"minReplicas": 1, "maxReplicas": 2},
                       scheduling={"topology": {"key": "example.com/rack", "mode": "Required"}})  # fmt: skip
    result = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(job),
                             check=False)  # fmt: skip
    assert result.returncode != 0
    assert "spec.elastic cannot be used with spec.scheduling.topology mode Required" in result.stderr


def test_the_topology_of_an_active_job_changes_only_while_suspended(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    # From the first review (m7): the placement a running gang was admitted under must not move
    # under it (its ranks follow the domains); as with the template, suspend first.
    rack = {"key": "example.com/rack", "mode": "Required"}
    cluster.apply(training_job("placed", replicas=2, scheduling={"topology": rack}), namespace)
    for change in ({**rack, "mode": "Preferred"}, None):
        result = patch_job(cluster, namespace, "placed", {"spec": {"scheduling": {"topology": change}}})
        assert result.returncode != 0, change
        assert "spec.scheduling.topology can change only while the job is suspended" in result.stderr
    cluster.apply(training_job("unplaced", replicas=2), namespace)  # adding one is a change too
    result = patch_job(cluster, namespace, "unplaced", {"spec": {"scheduling": {"topology": rack}}})
    assert result.returncode != 0 and "spec.scheduling.topology can change only" in result.stderr
    result = patch_job(cluster, namespace, "placed", {"spec": {"runPolicy": {"suspend": True},
                       "scheduling": {"topology": {**rack, "mode": "Preferred"}}}})  # fmt: skip
    assert result.returncode == 0, result.stderr


def patch_job(cluster: Cluster, namespace: str, name: str, patch: dict[str, Any]) -> Any:
    return cluster.kubectl(
        "patch", "tj", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch), check=False
    )


SCHEDULING = {
    "nodeSelector": {"cloud.example.com/flavor": "a100"},
    "tolerations": [{"key": "flavor", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
    ]}},
    "schedulingGates": [{"name": "example.com/quota"}],
}  # fmt: skip


def test_one_update_that_unsuspends_and_injects_scheduling_fields_is_accepted(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    # What Kueue does on admission: suspend false and the flavor's node selector in a single update.
    cluster.apply(training_job("queued", replicas=2, runPolicy={"suspend": True}), namespace)
    result = patch_job(cluster, namespace, "queued",
                       {"spec": {"runPolicy": {"suspend": False}, "template": {"spec": SCHEDULING}}})  # fmt: skip
    assert result.returncode == 0, result.stderr
    spec = cluster.get_json("tj", "queued", "-n", namespace)["spec"]
    assert spec["runPolicy"]["suspend"] is False
    assert spec["template"]["spec"]["nodeSelector"] == SCHEDULING["nodeSelector"]
    # Eviction by a queue: suspend again in one update that takes the injected fields away.
    result = patch_job(cluster, namespace, "queued",
                       {"spec": {"runPolicy": {"suspend": True}, "template": {"spec": {"nodeSelector": None}}}})  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_scheduling_fields_of_a_running_job_stay_fixed(
    cluster: Cluster, crd_installed: None, namespace: str
) -> None:
    cluster.apply(training_job("active", replicas=2), namespace)
    result = patch_job(
        cluster, namespace, "active", {"spec": {"template": {"spec": {"nodeSelector": {"a": "b"}}}}}
    )
    assert result.returncode != 0
    assert "spec.template can change only while the job is suspended" in result.stderr
