"""reconciler.probe_most: how many pods an elastic gang's room is measured (and held) up to."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx import constants as c
from phalanx.controller.reconciler import probe_most

pytestmark = pytest.mark.unit

JOB: dict[str, Any] = {
    "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
    "spec": {
        "elastic": {"minReplicas": 1, "maxReplicas": 4},
        "template": {"spec": {"containers": [{"name": "trainer"}]}},
    },
}


def attempt_pod(index: int, attempt: int, size: int) -> dict[str, Any]:
    return {"metadata": {"name": f"j-{index}", "namespace": "ns",
                         "labels": {c.LABEL_ATTEMPT: str(attempt), c.LABEL_REPLICA_INDEX: str(index),
                                    c.LABEL_GANG_SIZE: str(size)}}}  # fmt: skip


def test_a_new_attempt_to_size_is_measured_up_to_max_replicas() -> None:
    assert probe_most({**JOB, "status": {"attempt": 1}}, []) == 4


def test_a_running_gang_is_measured_and_held_up_to_max_less_what_it_runs() -> None:
    status = {"attempt": 1, "createdAttempt": 1, "sizedAttempt": 1, "currentReplicas": 1}
    assert probe_most({**JOB, "status": status}, [attempt_pod(0, 1, 1)]) == 3
