"""Leader election's decision (pure): who may take the lease, judged by the reader's own clock."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from phalanx.leader import Action, LeaderElector, LeaseRecord, NotLeader, Observation, decide, lease_body

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


# -- the elector's rounds against an in-memory lease, on a clock the test moves ------------------


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class MemoryLeases:
    """One Lease with resourceVersion checks, as the API server keeps it."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.fail_reads = False

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.fail_reads:
            raise ApiError(503)
        return copy.deepcopy(self.lease)

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        if self.lease is not None:
            raise ApiError(409)
        self._store(body)

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        if (
            self.lease is None
            or body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]
        ):
            raise ApiError(409)
        self._store(body)

    def _store(self, body: dict[str, Any]) -> None:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(leases: MemoryLeases, clock: Clock, identity: str, lost: list[str]) -> LeaderElector:
    return LeaderElector(leases, "ns", "lease", identity, on_lost=lambda: lost.append(identity),
                         duration_seconds=15, renew_deadline_seconds=10, retry_period_seconds=2,
                         clock=clock)  # fmt: skip


def test_the_first_candidate_leads_and_the_second_stands_by() -> None:
    leases, clock, lost = MemoryLeases(), Clock(), []
    a, b = elector(leases, clock, "a", lost), elector(leases, clock, "b", lost)
    assert a.try_once(clock()) is Action.CREATE and a.may_write()
    assert b.try_once(clock()) is Action.STAND_BY and not b.may_write()
    with pytest.raises(NotLeader):
        b.fence()


def test_a_leader_that_cannot_renew_stops_writing_at_its_renew_deadline() -> None:
    """Before the lease expires for others (15 s), the leader's own fence has closed (10 s)."""
    leases, clock, lost = MemoryLeases(), Clock(), []
    a = elector(leases, clock, "a", lost)
    a.try_once(clock())
    leases.fail_reads = True
    clock.now += 9.9
    assert a.may_write()
    clock.now += 0.2
    assert not a.may_write()


def test_a_deleted_lease_taken_by_the_standby_stops_the_old_leader_at_once() -> None:
    leases, clock, lost = MemoryLeases(), Clock(), []
    a, b = elector(leases, clock, "a", lost), elector(leases, clock, "b", lost)
    a.try_once(clock())
    leases.lease = None  # kubectl delete lease
    clock.now += 2
    assert b.try_once(clock()) is Action.CREATE and b.may_write()
    assert a.try_once(clock()) is Action.STAND_BY  # its create met b's lease (409)
    assert not a.may_write() and lost == ["a"]


def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    leases, clock, lost = MemoryLeases(), Clock(), []
    a = elector(leases, clock, "a", lost)
    a.try_once(clock())
    assert leases.lease is not None
    leases.lease["spec"]["holderIdentity"] = "c"
    a.try_once(clock())
    assert not a.may_write() and lost == ["a"]


def test_a_standby_takes_over_a_lease_not_renewed_for_its_duration() -> None:
    leases, clock, lost = MemoryLeases(), Clock(), []
    a, b = elector(leases, clock, "a", lost), elector(leases, clock, "b", lost)
    a.try_once(clock())
    b.try_once(clock())
    clock.now += 14.9
    assert b.try_once(clock()) is Action.STAND_BY
    clock.now += 0.2
    assert b.try_once(clock()) is Action.TAKE_OVER and b.may_write()
    assert leases.lease is not None and leases.lease["spec"]["leaseTransitions"] == 1


def test_shutdown_closes_the_fence_first_and_releases_the_lease_for_the_standby() -> None:
    leases, clock, lost = MemoryLeases(), Clock(), []
    a, b = elector(leases, clock, "a", lost), elector(leases, clock, "b", lost)
    a.try_once(clock())
    a.close_fence()
    assert not a.may_write()
    assert a.try_once(clock()) is Action.RENEW and not a.may_write()  # still held while it drains
    a.stop(release=True)
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == ""
    assert b.try_once(clock()) is Action.TAKE_OVER and lost == []


def test_shutdown_without_release_leaves_the_lease_to_expire() -> None:
    leases, clock, lost = MemoryLeases(), Clock(), []
    a = elector(leases, clock, "a", lost)
    a.try_once(clock())
    a.stop(release=False)
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "a"


def test_every_write_request_passes_the_fence_and_reads_do_not() -> None:
    from phalanx.k8s import count_requests
    from phalanx.kube_client import Credentials, KubeClient

    sent: list[str] = []

    def send(method: str, path: str, *args: Any) -> Any:
        sent.append(method)
        return SimpleNamespace(status=200)

    def refuse() -> None:
        raise NotLeader("standby")

    api_client = KubeClient(Credentials(server="http://127.0.0.1:1"))
    api_client._send = send  # type: ignore[method-assign]
    count_requests(api_client, refuse)
    api_client.request("GET", "/api/v1/pods")
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        with pytest.raises(NotLeader):
            api_client.request(method, "/api/v1/namespaces/ns/pods")
    assert sent == ["GET"]


def test_impossible_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderElector(MemoryLeases(), "ns", "l", "a", on_lost=lambda: None, duration_seconds=4,
                      renew_deadline_seconds=2.3, retry_period_seconds=2)  # fmt: skip


def test_requests_get_a_timeout_unless_they_watch_or_bring_their_own() -> None:
    from phalanx.k8s import REQUEST_TIMEOUT, count_requests
    from phalanx.kube_client import Credentials, KubeClient

    seen: list[Any] = []

    def send(method: str, path: str, params: Any, body: Any, content_type: str, timeout: Any) -> Any:
        seen.append(timeout)
        return SimpleNamespace(status=200)

    api_client = KubeClient(Credentials(server="http://127.0.0.1:1"))
    api_client._send = send  # type: ignore[method-assign]
    count_requests(api_client)
    api_client.request("POST", "/api/v1/namespaces/n/pods")
    api_client.request("GET", "/api/v1/pods", {"watch": True})
    api_client.request("GET", "/api/v1/pods", None, None, "application/json", (1, 2))
    assert seen == [REQUEST_TIMEOUT, None, (1, 2)]


def test_a_leader_whose_own_lost_write_lands_late_keeps_the_lease() -> None:
    # From the 429/503 storm test: a renewal's answer was lost, the write landed after the next
    # round's read, that round's write met a newer version (409), and the leader gave up although
    # the lease was its own.
    leases, clock, lost = MemoryLeases(), Clock(), []
    a = elector(leases, clock, "a", lost)
    a.try_once(clock())
    late = leases.replace

    def replace_after_a_late_write(namespace: str, name: str, body: dict[str, Any]) -> None:
        assert leases.lease is not None
        leases._store(leases.lease)  # the earlier, lost write of "a" lands now: a newer version
        leases.replace = late  # type: ignore[method-assign]
        late(namespace, name, body)

    leases.replace = replace_after_a_late_write  # type: ignore[method-assign]
    clock.now += 2
    assert a.try_once(clock()) is Action.RENEW
    assert a.may_write() and lost == []
    clock.now += 2
    assert a.try_once(clock()) is Action.RENEW and leases.lease is not None
    assert leases.lease["spec"]["holderIdentity"] == "a"
    # Another candidate's write behind the 409 still ends the leadership at once.

    def replace_after_another_write(namespace: str, name: str, body: dict[str, Any]) -> None:
        assert leases.lease is not None
        leases._store({**leases.lease, "spec": {**leases.lease["spec"], "holderIdentity": "c"}})
        leases.replace = late  # type: ignore[method-assign]
        late(namespace, name, body)

    leases.replace = replace_after_another_write  # type: ignore[method-assign]
    clock.now += 2
    assert a.try_once(clock()) is Action.STAND_BY
    assert not a.may_write() and lost == ["a"]
