"""Early start (gang/early_start.py): a blocked head whose nodes' work ends within the lead is
admitted onto them at once; what ends, what stays, and what plan_admission does with it."""

from __future__ import annotations

import math

import pytest

from phalanx.gang.admission import plan_admission
from phalanx.gang.backfill import job_end
from phalanx.gang.early_start import EARLY_START_SECONDS, EarlyStart, PodOnNode, node_handovers
from tests.unit.test_gang_admission import gang, gpu_node

pytestmark = pytest.mark.unit

NOW = 1000.0
GPU = "nvidia.com/gpu"


def gpus(count: int) -> dict[str, int]:
    return {GPU: count * 1000}


def running(node: str, job: str | None, count: int = 8, priority: int = 0, bound: bool = True) -> PodOnNode:
    return PodOnNode(node, job, bound, gpus(count), priority)


def test_bound_pods_of_jobs_with_an_end_end_and_everything_else_stays() -> None:
    ends = {"ns/soon": NOW + 1, "ns/later": NOW + 30, "ns/unknown": math.inf, "ns/overdue": NOW - 10}
    handovers = node_handovers(
        [
            running("n0", "ns/soon", 4),
            running("n0", "ns/later", 2),
            running("n1", "ns/unknown", 4),
            running("n1", None, 1),  # another owner's pod
            running("n2", "ns/soon", 4, bound=False),  # admitted, not bound yet: it will run there
            running("n3", "ns/overdue", 8),
        ],
        ends,
        NOW,
    )
    assert handovers["n0"].ends_at == NOW + 30 and handovers["n0"].stays == {}
    assert handovers["n1"].ends_at == -math.inf and handovers["n1"].stays == gpus(5)
    assert handovers["n2"].stays == gpus(4)
    assert handovers["n3"].stays == gpus(8), "an estimate long past is no estimate"


def test_a_job_a_little_past_its_estimate_still_ends() -> None:
    # status.startTime has whole seconds: a hinted end can read up to a second early.
    handovers = node_handovers([running("n0", "ns/a")], {"ns/a": NOW - 0.5}, NOW)
    assert handovers["n0"].stays == {} and handovers["n0"].ends_at == NOW - 0.5
    assert EarlyStart(handovers).start(["n0"], NOW) == NOW


def test_room_is_given_only_within_the_lead() -> None:
    handovers = node_handovers([running("n0", "ns/a")], {"ns/a": NOW + EARLY_START_SECONDS + 1}, NOW)
    early = EarlyStart(handovers)
    allocatable = {"n0": gpus(8)}
    assert early.room(["n0"], allocatable, {}, 0, NOW) is None
    assert early.recheck_at(["n0"], NOW) == pytest.approx(NOW + 1)
    assert early.room(["n0"], allocatable, {}, 0, NOW + 1) == {"n0": gpus(8)}
    assert early.recheck_at(["n0"], NOW + 1) is None


def test_room_leaves_out_what_stays_and_what_this_pass_placed() -> None:
    handovers = node_handovers([running("n0", "ns/a", 4), running("n0", None, 1)], {"ns/a": NOW + 1}, NOW)
    room = EarlyStart(handovers).room(["n0"], {"n0": gpus(8)}, {"n0": gpus(2)}, 0, NOW)
    assert room == {"n0": gpus(5)}


def test_no_early_start_over_a_pod_of_lower_priority() -> None:
    # The scheduler would preempt it to bind the waiting pod at once.
    handovers = node_handovers([running("n0", "ns/a", priority=0)], {"ns/a": NOW + 1}, NOW)
    early = EarlyStart(handovers)
    assert early.room(["n0"], {"n0": gpus(8)}, {}, 10, NOW) is None
    assert early.room(["n0"], {"n0": gpus(8)}, {}, 0, NOW) is not None


def test_an_unknown_end_is_never_waited_for() -> None:
    early = EarlyStart(node_handovers([running("n0", "ns/a")], {}, NOW))
    assert early.recheck_at(["n0"], NOW) is None


def test_a_running_job_without_an_eta_ends_at_its_hinted_end() -> None:
    assert job_end({"phase": "Running"}, NOW, hinted_end=NOW + 20) == NOW + 20
    assert job_end({"phase": "Running", "progress": {"etaSeconds": 5}}, NOW, hinted_end=NOW + 20) == NOW + 5
    assert job_end({"phase": "Admitted"}, NOW, hinted_end=NOW + 20) == math.inf


def two_full_nodes_ending(at: float) -> tuple[list, dict[str, dict[str, int]], EarlyStart]:
    nodes = [gpu_node("n0"), gpu_node("n1")]
    used = {"n0": gpus(8), "n1": gpus(8)}
    early = EarlyStart(node_handovers([running("n0", "ns/a"), running("n1", "ns/b")],
                                      {"ns/a": at, "ns/b": at}, NOW))  # fmt: skip
    return nodes, used, early


def test_a_head_whose_nodes_free_within_the_lead_is_admitted_onto_them() -> None:
    nodes, used, early = two_full_nodes_ending(NOW + 1)
    plan = plan_admission([gang("head", 2, 8)], nodes, used, NOW, early=early)
    assert [a.key for a in plan.admitted] == ["head"]
    assert sorted(node for _, node in plan.admitted[0].placements) == ["n0", "n1"]
    assert not plan.waiting and not plan.reservations


def test_a_head_whose_nodes_free_later_waits_and_asks_for_a_pass_then() -> None:
    nodes, used, early = two_full_nodes_ending(NOW + 10)
    plan = plan_admission([gang("head", 2, 8)], nodes, used, NOW, early=early)
    assert not plan.admitted and "head" in plan.waiting
    assert plan.recheck_at == pytest.approx(NOW + 10 - EARLY_START_SECONDS)


def test_without_early_start_the_head_waits_for_the_room() -> None:
    nodes, used, _ = two_full_nodes_ending(NOW + 1)
    plan = plan_admission([gang("head", 2, 8)], nodes, used, NOW)
    assert not plan.admitted and plan.recheck_at is None


def test_two_heads_in_one_pass_never_share_the_room_that_frees() -> None:
    nodes, used, early = two_full_nodes_ending(NOW + 1)
    plan = plan_admission([gang("a", 1, 8, created=0.0), gang("b", 1, 8, created=1.0),
                           gang("c", 1, 8, created=2.0)], nodes, used, NOW, early=early)  # fmt: skip
    placed = [node for a in plan.admitted for _, node in a.placements]
    assert [a.key for a in plan.admitted] == ["a", "b"]
    assert sorted(placed) == ["n0", "n1"], "each freed node went to one gang"
    assert "c" in plan.waiting


def test_a_head_holds_nodes_whose_work_ends_before_nodes_just_given_to_another() -> None:
    # n0 was just given to a gang (admitted, not bound: it stays for its whole run); n1 runs a job
    # that ends in a minute. Both are full now; the head should wait for n1.
    nodes = [gpu_node("n0"), gpu_node("n1")]
    used = {"n0": gpus(8), "n1": gpus(8)}
    early = EarlyStart(node_handovers([running("n0", "ns/new", bound=False), running("n1", "ns/old")],
                                      {"ns/old": NOW + 60}, NOW))  # fmt: skip
    plan = plan_admission([gang("head", 1, 8)], nodes, used, NOW, early=early)
    assert plan.reservations == {"head": ("n1",)}
