"""Every request the operator's API client sends is counted by method, path template and status."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from phalanx import metrics
from phalanx.k8s import count_requests

pytestmark = pytest.mark.unit


class Raw:
    status = 201


def sample(method: str, endpoint: str, code: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "phalanx_api_requests_total", {"method": method, "endpoint": endpoint, "code": code}
    )
    return value or 0.0


def test_requests_are_counted_by_method_template_and_status() -> None:
    api_client = client.ApiClient(client.Configuration())
    answers: list[Any] = [Raw(), ApiException(status=409), ConnectionError("refused")]

    def fake_call_api(resource_path: str, method: str, *args: Any, **kwargs: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    api_client.call_api = fake_call_api  # type: ignore[method-assign,assignment]
    count_requests(api_client)
    path = "/api/v1/namespaces/{namespace}/pods"
    before = [sample("POST", path, code) for code in ("201", "409", "error")]
    assert isinstance(api_client.call_api(path, "POST"), Raw)
    with pytest.raises(ApiException):
        api_client.call_api(path, "POST")
    with pytest.raises(ConnectionError):
        api_client.call_api(path, "POST")
    after = [sample("POST", path, code) for code in ("201", "409", "error")]
    assert [b - a for a, b in zip(before, after, strict=True)] == [1.0, 1.0, 1.0]
