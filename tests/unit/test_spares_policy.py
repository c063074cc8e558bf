"""Warm spares, the pure policy (policy/spares.py): which spares stand by, are ready or lost, the
names of new ones, which spare takes which lost rank, and status.spares."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.constants import SPARE_BACKOFF_MAX_SECONDS, SPARE_BACKOFF_SECONDS
from phalanx.policy.spares import (
    assign_spares,
    count_spares,
    is_ready_spare,
    new_spare_numbers,
    replacement_backoff,
    spare_number,
    spares_status,
    spares_to_create,
    surplus_spares,
)

pytestmark = pytest.mark.unit

LAUNCHER = {"phalanx.dev/resident-launcher": "true"}
NODES: dict[str, Any] = {"n0": {}, "n1": {}}


def spare(
    number: int, phase: str = "Running", ip: str | None = "10.0.1.1", ready: bool = True, **metadata: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    if phase == "Running" and ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    return {
        "metadata": {"name": f"j-spare-{number}", "uid": f"s{number}", "annotations": LAUNCHER,
                     "labels": {"phalanx.dev/spare": "true", "phalanx.dev/attempt": "0"}, **metadata},
        "spec": {"nodeName": "n0"},
        "status": status,
    }  # fmt: skip


def taking(name: str, uid: str, rank: int) -> dict[str, Any]:
    """A status whose in-place attempt has this spare take `rank`."""
    kept = [{"name": "j-worker-0", "uid": "p0"}, {"name": name, "uid": uid, "rank": rank}]
    return {"attempt": 1, "inPlace": {"attempt": 1, "keptPods": kept}}


def test_a_ready_spare_runs_with_an_address_stays_and_takes_generations() -> None:
    assert is_ready_spare(spare(0))
    assert not is_ready_spare(spare(0, phase="Pending"))
    assert not is_ready_spare(spare(0, ip=None))
    assert not is_ready_spare(spare(0, ready=False))  # its launcher does not answer yet: imports not done
    assert not is_ready_spare(spare(0, deletionTimestamp="2026-01-01T00:00:00Z"))
    assert not is_ready_spare(spare(0, annotations={}))  # no resident launcher: nothing to tell a rank


def test_spares_are_counted_by_state_and_one_taking_a_rank_is_no_longer_standing_by() -> None:
    pods = [
        spare(0),
        spare(1, phase="Pending", ip=None),
        spare(2, deletionTimestamp="2026-01-01T00:00:00Z"),  # evicted: going
        spare(3, phase="Failed"),  # ended: to delete
        {"metadata": {"name": "j-worker-0", "labels": {"phalanx.dev/replica-index": "0"}}, "status": {}},
    ]
    count = count_spares(pods, {"attempt": 0})
    assert count.alive == ("j-spare-0", "j-spare-1") and count.ready == ("j-spare-0",)
    assert count.lost == ("j-spare-2", "j-spare-3") and count.ended == ("j-spare-3",)
    taken = count_spares(pods, taking("j-spare-0", "s0", 1))
    assert taken.alive == ("j-spare-1",) and taken.ready == ()


def test_a_spares_taking_of_an_earlier_attempt_does_not_count() -> None:
    status = {**taking("j-spare-0", "s0", 1), "attempt": 2}  # status.inPlace is attempt 1's
    assert count_spares([spare(0)], status).alive == ("j-spare-0",)


def test_new_spares_take_numbers_no_pod_holds() -> None:
    names = ["j-spare-0", "j-spare-2", "j-worker-0", "j-spare-x"]
    assert new_spare_numbers("j", names, 3) == [1, 3, 4]
    assert new_spare_numbers("j", [], 2) == [0, 1]
    assert new_spare_numbers("j", names, 0) == []
    # another job whose name starts the same holds nothing of this one's
    assert new_spare_numbers("j", ["jj-spare-0"], 1) == [0]
    assert spare_number("j-spare-12") == 12 and spare_number("j-worker-1") == -1


def test_as_many_are_created_as_fall_short_and_surplus_ones_go_newest_starting_first() -> None:
    count = count_spares([spare(0), spare(1, phase="Pending", ip=None), spare(2)], {"attempt": 0})
    assert spares_to_create(5, count) == 2 and spares_to_create(3, count) == 0
    assert surplus_spares(3, count) == []
    assert surplus_spares(1, count) == ["j-spare-1", "j-spare-2"]  # the one still starting first


def test_lost_ranks_go_to_the_ready_spares_in_order() -> None:
    assert assign_spares((3, 1), ("j-spare-0", "j-spare-4")) == {1: "j-spare-0", 3: "j-spare-4"}
    assert assign_spares((1, 2), ("j-spare-0",)) == {1: "j-spare-0"}  # rank 2: a new pod, as without spares
    assert assign_spares((1,), ()) == {}


def test_the_status_says_ready_over_desired() -> None:
    count = count_spares([spare(0), spare(1, phase="Pending", ip=None)], {"attempt": 0})
    assert spares_status(2, count) == {
        "desired": 2,
        "ready": 1,
        "summary": "1/2",
        "pods": ["j-spare-0", "j-spare-1"],
    }


def test_a_spare_on_a_lost_node_is_lost_though_it_may_still_say_running() -> None:
    count = count_spares([spare(0), spare(1)], {"attempt": 0}, NODES, lost_nodes={"n0"})
    assert count.alive == () and count.ready == () and count.lost == ("j-spare-0", "j-spare-1")
    assert count.ended == ()  # nobody confirms it stopped: it is not deleted as ended


def test_a_spare_on_a_node_that_no_longer_exists_is_lost() -> None:
    count = count_spares([spare(0)], {"attempt": 0}, {"n1": {}}, lost_nodes=())
    assert count.alive == () and count.lost == ("j-spare-0",)
    assert count_spares([spare(0)], {"attempt": 0}, {}, ()).alive == ("j-spare-0",)  # nodes not known yet


def test_status_lists_at_most_desired_spares() -> None:
    # spec.spares lowered from 16 to 1: status.spares.pods (maxItems 16) must stay within bounds.
    count = count_spares([spare(n) for n in range(17)], {"attempt": 0})
    status = spares_status(1, count)
    assert status["pods"] == ["j-spare-0"] and status["desired"] == 1


def test_spare_replacement_backs_off_exponentially_up_to_a_cap() -> None:
    assert [replacement_backoff(n) for n in (1, 2, 3)] == [
        SPARE_BACKOFF_SECONDS,
        2 * SPARE_BACKOFF_SECONDS,
        4 * SPARE_BACKOFF_SECONDS,
    ]
    assert replacement_backoff(50) == SPARE_BACKOFF_MAX_SECONDS
