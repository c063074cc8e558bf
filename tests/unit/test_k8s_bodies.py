"""What KubeApi sends matches what the kubernetes package's client sent for the same call: the
delete options and their preconditions, the Eviction, and the content type of each patch."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from phalanx import k8s

pytestmark = pytest.mark.unit


class Answer:
    status = 200
    data = json.dumps({"metadata": {"name": "x", "uid": "u", "resourceVersion": "1"}, "items": []}).encode()

    def drain_conn(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class Recording:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any, str]] = []

    def request(self, method: str, path: str, params: Any = None, body: Any = None,
                content_type: str = "application/json", timeout: Any = None) -> Answer:  # fmt: skip
        self.sent.append((method, path, body, content_type))
        return Answer()


def as_the_kubernetes_client_sent(model: Any) -> Any:
    return client.ApiClient().sanitize_for_serialization(model)


def sent_by(call: Any) -> tuple[str, str, Any, str]:
    recording = Recording()
    call(k8s.KubeApi(recording))  # type: ignore[arg-type]
    [sent] = recording.sent
    return sent


def without_type(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("apiVersion", "kind")}


def test_a_pod_deletion_names_its_grace_period_and_preconditions() -> None:
    method, path, body, _ = sent_by(lambda api: api.delete_pod("ns", "p-0", "uid-1", 0, "42"))
    assert (method, path) == ("DELETE", "/api/v1/namespaces/ns/pods/p-0")
    expected = client.V1DeleteOptions(grace_period_seconds=0,
                                      preconditions=client.V1Preconditions(uid="uid-1", resource_version="42"))  # fmt: skip
    assert without_type(body) == as_the_kubernetes_client_sent(expected)
    _, _, bare, _ = sent_by(lambda api: api.delete_pod("ns", "p-0", None, None))
    assert without_type(bare) == {}


def test_a_job_and_a_workload_are_deleted_in_the_background_by_uid() -> None:
    expected = as_the_kubernetes_client_sent(
        client.V1DeleteOptions(propagation_policy="Background", preconditions=client.V1Preconditions(uid="u"))
    )
    for call, path in (
        (
            lambda api: api.delete_job("ns", "j", "u"),
            "/apis/phalanx.dev/v1alpha1/namespaces/ns/trainingjobs/j",
        ),
        (
            lambda api: api.delete_workload("ns", "w", "u"),
            "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/w",
        ),
    ):
        method, sent_path, body, _ = sent_by(call)
        assert (method, sent_path, without_type(body)) == ("DELETE", path, expected)


def test_an_eviction_carries_its_pod_and_delete_options() -> None:
    method, path, body, _ = sent_by(lambda api: api.evict_pod("ns", "p-0", "uid-1", 30))
    assert (method, path) == ("POST", "/api/v1/namespaces/ns/pods/p-0/eviction")
    expected = as_the_kubernetes_client_sent(client.V1Eviction(
        metadata=client.V1ObjectMeta(name="p-0", namespace="ns"),
        delete_options=client.V1DeleteOptions(grace_period_seconds=30, preconditions=client.V1Preconditions(uid="uid-1")),
    ))  # fmt: skip
    assert body["apiVersion"] == "policy/v1" and body["kind"] == "Eviction"
    assert {**without_type(body), "deleteOptions": without_type(body["deleteOptions"])} == expected


def test_each_patch_says_which_kind_of_patch_it_is() -> None:
    merge, json_patch = "application/merge-patch+json", "application/json-patch+json"
    cases = [
        (lambda api: api.patch_job_status("ns", "j", {"phase": "Running"}, "7"), merge),
        (lambda api: api.patch_workload("ns", "w", {"spec": {"active": False}}), merge),
        (lambda api: api.patch_workload_status("ns", "w", {"conditions": []}, "7"), merge),
        (lambda api: api.admit_pod("ns", "p", {"affinity": {}, "schedulingGates": []}), json_patch),
        (lambda api: api.relabel_pod("ns", "p", "u", {"a": "b"}), json_patch),
    ]
    for call, content_type in cases:
        method, _, _, sent_type = sent_by(call)
        assert (method, sent_type) == ("PATCH", content_type)
