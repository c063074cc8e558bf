"""What one decision produces: events (reconcile/plan.py)."""

from __future__ import annotations

import pytest

from phalanx.reconcile.lifecycle import decide
from phalanx.reconcile.plan import Event, merged_events
from tests.unit.lifecycle_fixtures import NODES, NOW, RUNNING, job, pod

pytestmark = pytest.mark.unit


def test_phase_change_emits_one_event_and_repeating_emits_none() -> None:
    plan = decide(
        job(dict(RUNNING)),
        [pod(0, phase="Succeeded", exit_code=0), pod(1, phase="Succeeded", exit_code=0)],
        NODES,
        NOW,
    )
    assert [e.reason for e in plan.events] == ["Completed"]
    again = decide(job(dict(plan.status)), [pod(0, phase="Succeeded", exit_code=0)], NODES, NOW)
    assert again.events == []


def test_normal_events_of_one_reconcile_become_one_and_warnings_stay_apart() -> None:
    created = Event("Normal", "Created", "created 4 pod(s) for attempt 0")
    admitted = Event("Normal", "GangAdmitted", "0/4 worker(s) running")
    conflict = Event("Warning", "NameConflict", "pod w-1 exists")
    assert merged_events([created]) == [created]
    assert merged_events([created, conflict]) == [created, conflict]
    assert merged_events([created, conflict, admitted]) == [
        Event("Normal", "GangAdmitted", "created 4 pod(s) for attempt 0; 0/4 worker(s) running"),
        conflict,
    ]


def test_an_event_marked_alone_is_never_merged() -> None:
    resized = Event("Normal", "Resized", "gang grows from 1 to 2 pod(s): after Resize", alone=True)
    created = Event("Normal", "Created", "created 2 pod(s) for attempt 1")
    admitted = Event("Normal", "GangAdmitted", "0/2 worker(s) running")
    assert merged_events([resized, created, admitted]) == [
        Event("Normal", "GangAdmitted", "created 2 pod(s) for attempt 1; 0/2 worker(s) running"),
        resized,
    ]
