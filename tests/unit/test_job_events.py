"""A status-only event of a TrainingJob needs no reconcile; anything a reconcile decides on does."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from phalanx.policy.job_events import event_marker

pytestmark = pytest.mark.unit

JOB: dict[str, Any] = {
    "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "generation": 3, "resourceVersion": "10",
                 "labels": {"team": "a"}},
    "spec": {"replicas": 2},
    "status": {"phase": "Running", "attempt": 0},
}  # fmt: skip


def changed(path: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(JOB)
    *parents, last = path.split(".")
    target = body
    for part in parents:
        target = target.setdefault(part, {})
    target[last] = value
    return body


def test_a_status_write_is_not_worth_a_reconcile() -> None:
    assert event_marker(changed("status.phase", "Restarting")) == event_marker(JOB)
    assert event_marker(changed("metadata.resourceVersion", "11")) == event_marker(JOB)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.generation", 4),  # a spec edit
        ("metadata.uid", "u2"),  # deleted and re-created by name
        ("metadata.deletionTimestamp", "2026-12-01T00:00:00Z"),
        ("metadata.labels", {"team": "a", "kueue.x-k8s.io/queue-name": "q"}),
    ],
)
def test_what_a_reconcile_decides_on_is_worth_one(path: str, value: Any) -> None:
    assert event_marker(changed(path, value)) != event_marker(JOB)
