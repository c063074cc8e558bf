"""Leader election's decision (pure): who may take the lease, judged by the reader's own clock."""

from __future__ import annotations

import pytest

from phalanx.leader import Action, LeaseRecord, Observation, decide, lease_body

pytestmark = pytest.mark.unit


def held_by(holder: str, renewed: str = "t1") -> LeaseRecord:
    return LeaseRecord(holder=holder, renew_time=renewed, duration_seconds=15, transitions=2)


def test_no_lease_is_created() -> None:
    assert decide("me", None, None, now=0.0) == (Action.CREATE, None)


def test_our_own_lease_is_renewed() -> None:
    action, _ = decide("me", held_by("me"), None, now=5.0)
    assert action is Action.RENEW


def test_a_released_lease_is_taken_at_once() -> None:
    action, _ = decide("me", held_by(""), None, now=5.0)
    assert action is Action.TAKE_OVER


def test_a_lease_renewed_by_its_holder_is_left_alone() -> None:
    first = decide("me", held_by("other", "t1"), None, now=0.0)
    assert first[0] is Action.STAND_BY
    later = decide("me", held_by("other", "t2"), first[1], now=14.0)  # renewed meanwhile
    assert later[0] is Action.STAND_BY
    assert later[1] == Observation(held_by("other", "t2"), 14.0)  # the clock restarts at the change


def test_a_lease_not_renewed_for_its_duration_by_our_clock_is_taken() -> None:
    """The holder's renewTime is never compared with our clock: only how long we saw no change."""
    _, seen = decide("me", held_by("other", "2000-01-01T00:00:00.000000Z"), None, now=100.0)
    assert (
        decide("me", held_by("other", "2000-01-01T00:00:00.000000Z"), seen, now=114.9)[0] is Action.STAND_BY
    )
    assert (
        decide("me", held_by("other", "2000-01-01T00:00:00.000000Z"), seen, now=115.0)[0] is Action.TAKE_OVER
    )


def test_an_update_carries_the_resource_version_it_read() -> None:
    body = lease_body("ns", "l", "me", "now", 15, 3, "then", resource_version="42")
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["spec"] == {"holderIdentity": "me", "leaseDurationSeconds": 15, "acquireTime": "then",
                            "renewTime": "now", "leaseTransitions": 3}  # fmt: skip
