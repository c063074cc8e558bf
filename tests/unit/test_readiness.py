"""Readiness: "stores synced and leading or standing by", not just "process alive"."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from phalanx.health import HealthServer
from phalanx.policy.readiness import Election, Readiness, readiness

pytestmark = pytest.mark.unit

SYNCED = {"trainingjobs": True, "pods": True, "nodes": True}
UNSYNCED = {"trainingjobs": True, "pods": False, "nodes": False}
LEADER = Election(leading=True, in_contact=True, holder="me")
STANDBY = Election(leading=False, in_contact=True, holder="other")
NO_LEASE_SEEN = Election(leading=False, in_contact=False, holder="")


@pytest.mark.parametrize("election", [LEADER, STANDBY, None], ids=["leader", "standby", "no-election"])
def test_not_ready_before_the_stores_are_synced(election: Election | None) -> None:
    verdict = readiness(UNSYNCED, election)
    assert not verdict.ready
    assert "pods" in verdict.reason and "nodes" in verdict.reason and "trainingjobs" not in verdict.reason


def test_ready_when_synced_and_leading() -> None:
    verdict = readiness(SYNCED, LEADER)
    assert verdict.ready and "leading" in verdict.reason


def test_ready_when_synced_and_standing_by() -> None:
    verdict = readiness(SYNCED, STANDBY)
    assert verdict.ready and "standing by" in verdict.reason and "other" in verdict.reason


def test_not_ready_before_a_lease_round_reached_the_api_server() -> None:
    verdict = readiness(SYNCED, NO_LEASE_SEEN)
    assert not verdict.ready and "lease" in verdict.reason


def test_ready_when_synced_without_leader_election() -> None:
    verdict = readiness(SYNCED, None)
    assert verdict.ready and "leader election off" in verdict.reason


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_health_server_answers_readyz_from_the_predicate_and_healthz_from_the_loop(
    loop: asyncio.AbstractEventLoop,
) -> None:
    state = {"verdict": Readiness(False, "waiting for the first list of: pods")}
    server = HealthServer("127.0.0.1", 0, loop, lambda: state["verdict"], loop_timeout=0.5).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{base}/readyz") == (503, "waiting for the first list of: pods\n")
        state["verdict"] = Readiness(True, "stores synced; leading")
        assert get(f"{base}/readyz") == (200, "stores synced; leading\n")
        assert get(f"{base}/healthz")[0] == 200
        assert get(f"{base}/other")[0] == 404
        loop.call_soon_threadsafe(time.sleep, 2.0)  # the event loop stops answering for a while
        time.sleep(0.1)
        assert get(f"{base}/healthz")[0] == 503
        time.sleep(2.0)
        assert get(f"{base}/healthz")[0] == 200  # and answers again once the loop does
    finally:
        server.stop()
