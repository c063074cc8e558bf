"""Creation: the attempt's missing pods, createdAttempt, and what creation learns (reconcile/rules/creation.py)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.rules.creation import creation_refused, name_conflict
from tests.unit.lifecycle_fixtures import NODES, NOW, job, pod

pytestmark = pytest.mark.unit


def test_a_new_job_creates_every_pod() -> None:
    plan = decide(job(), [], NODES, NOW)
    assert plan.create_indices == [0, 1]
    assert plan.status["phase"] == "Pending"


def test_after_a_crash_between_creations_only_missing_pods_are_created() -> None:
    plan = decide(job({"attempt": 0}), [pod(0, phase="Pending")], NODES, NOW)
    assert plan.create_indices == [1]


def test_all_pods_created_marks_the_attempt_created() -> None:
    plan = decide(job({"attempt": 0}), [pod(0, phase="Pending"), pod(1, phase="Pending")], NODES, NOW)
    assert plan.create_indices == [] and plan.status["createdAttempt"] == 0


def test_a_name_held_by_someone_else_is_reported_in_status_and_once_as_an_event() -> None:
    j = job({"attempt": 0})
    status: dict[str, Any] = {"conditions": []}
    event = name_conflict(j, status, ["pod j-worker-1"], NOW)
    assert event is not None and event.type == "Warning" and event.reason == "NameConflict"
    held = next(c for c in status["conditions"] if c["type"] == "PodsCreated")
    assert (held["status"], held["reason"]) == ("False", "NameConflict")
    assert "pod j-worker-1" in status["message"] and status["message"] == event.message
    # Told already (the job's status says so): no second event.
    assert (
        name_conflict(job({"attempt": 0, "message": status["message"]}), {}, ["pod j-worker-1"], NOW) is None
    )


def test_a_refusal_is_reported_with_the_api_servers_words_and_an_event_when_it_is_new() -> None:
    status: dict[str, Any] = {"conditions": []}
    event = creation_refused(job({"attempt": 0}), status, ["exceeded quota", "exceeded quota"], 2, NOW)
    assert event is not None and event.reason == "CreateRefused"
    assert status["message"] == "2/2 pod(s) refused by the API server: exceeded quota"
    refused = next(c for c in status["conditions"] if c["type"] == "PodsCreated")
    assert (refused["status"], refused["reason"]) == ("False", "CreateRefused")
    again = job({"attempt": 0, "conditions": status["conditions"]})
    assert creation_refused(again, {"conditions": []}, ["exceeded quota"] * 2, 2, NOW) is None
    assert creation_refused(again, {"conditions": []}, ["exceeded quota"], 2, NOW) is not None
