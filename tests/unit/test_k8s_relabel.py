"""KubeApi.relabel_pod (k8s.py): a relabel the API server refuses is logged, not swallowed."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from phalanx.k8s import KubeApi
from phalanx.kube_client import ApiError

pytestmark = pytest.mark.unit


class RefusingClient:
    def __init__(self, status: int) -> None:
        self.status = status

    def request(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        assert (method, path) == ("PATCH", "/api/v1/namespaces/ns/pods/j-spare-0")
        raise ApiError(self.status, "Unprocessable Entity")


@pytest.mark.parametrize("status", [404, 409, 422])
def test_a_refused_relabel_returns_none_and_says_why(status: int, caplog: pytest.LogCaptureFixture) -> None:
    api = KubeApi(RefusingClient(status))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="phalanx.k8s"):
        assert api.relabel_pod("ns", "j-spare-0", "s0", {"phalanx.dev/replica-index": "1"}) is None
    [record] = caplog.records
    assert "j-spare-0" in record.getMessage() and str(status) in record.getMessage()
