"""KubeApi.relabel_pod (k8s.py): a relabel the API server refuses is logged, not swallowed."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kubernetes.client import ApiException

from phalanx.k8s import KubeApi

pytestmark = pytest.mark.unit


class RefusingCore:
    def __init__(self, status: int) -> None:
        self.status = status

    def patch_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
        raise ApiException(status=self.status, reason="Unprocessable Entity")


@pytest.mark.parametrize("status", [404, 409, 422])
def test_a_refused_relabel_returns_none_and_says_why(status: int, caplog: pytest.LogCaptureFixture) -> None:
    api = object.__new__(KubeApi)
    api.core = RefusingCore(status)
    with caplog.at_level(logging.WARNING, logger="phalanx.k8s"):
        assert api.relabel_pod("ns", "j-spare-0", "s0", {"phalanx.dev/replica-index": "1"}) is None
    [record] = caplog.records
    assert "j-spare-0" in record.getMessage() and str(status) in record.getMessage()
