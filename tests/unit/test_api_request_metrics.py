"""Every request the operator's API client sends is counted by method, path template and status."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx import metrics
from phalanx.k8s import count_requests, endpoint_template
from phalanx.kube_client import ApiError, Credentials, KubeClient

pytestmark = pytest.mark.unit


class Raw:
    """What KubeClient.request returns for a success: the raw answer (an error status raises)."""

    def __init__(self, status: int) -> None:
        self.status = status


def sample(method: str, endpoint: str, code: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "phalanx_api_requests_total", {"method": method, "endpoint": endpoint, "code": code}
    )
    return value or 0.0


def fake_client(answers: list[Any]) -> KubeClient:
    """A real client whose sending is replaced: it answers from `answers` (raising an exception)."""
    client = KubeClient(Credentials(server="http://127.0.0.1:1"))

    def send(method: str, path: str, *args: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    client._send = send  # type: ignore[method-assign]
    return client


def test_requests_are_counted_by_method_template_and_status() -> None:
    api_client = fake_client([Raw(201), ApiError(409, "Conflict"), ConnectionError("refused")])
    count_requests(api_client)
    path = "/api/v1/namespaces/{namespace}/pods"
    before = [sample("POST", path, code) for code in ("201", "409", "error")]
    for namespace in ("team-a", "team-b", "team-c"):  # one series, whatever the namespace
        try:
            assert isinstance(api_client.request("POST", f"/api/v1/namespaces/{namespace}/pods"), Raw)
        except (ApiError, ConnectionError):
            pass
    after = [sample("POST", path, code) for code in ("201", "409", "error")]
    assert [b - a for a, b in zip(before, after, strict=True)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("url", "template"),
    [
        ("https://h:6443/api/v1/namespaces/ns/pods/llm-worker-3?dryRun=All", "/api/v1/namespaces/{namespace}/pods/{name}"),
        ("https://h/apis/phalanx.dev/v1alpha1/namespaces/ns/trainingjobs/llm/status",
         "/apis/phalanx.dev/v1alpha1/namespaces/{namespace}/trainingjobs/{name}/status"),
        ("https://h/api/v1/pods", "/api/v1/pods"),
        ("https://h/api/v1/nodes/gpu-node-7", "/api/v1/nodes/{name}"),
        ("https://h/apis/scheduling.k8s.io/v1/priorityclasses", "/apis/scheduling.k8s.io/v1/priorityclasses"),
    ],
)  # fmt: skip
def test_endpoints_are_path_templates_without_names(url: str, template: str) -> None:
    assert endpoint_template(url) == template
