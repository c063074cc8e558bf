"""ETA-aware backfill: what it reads (gang/backfill.py) and what plan_admission does with it."""

from __future__ import annotations

import math

import pytest

from phalanx.api.schema import parse
from phalanx.api.v1alpha1 import TrainingJobSpec
from phalanx.gang.admission import plan_admission
from phalanx.gang.backfill import PodOnNode, estimate_seconds, job_end, node_free_at, stated_end
from phalanx.gang.capacity import NodeInfo
from tests.unit.test_gang_admission import gang, gpu_node

pytestmark = pytest.mark.unit

NOW = 1000.0


def spec(**scheduling: object) -> TrainingJobSpec:
    return parse(TrainingJobSpec, {"replicas": 1, "scheduling": scheduling,
                                   "template": {"spec": {"containers": [{"name": "trainer"}]}}})  # fmt: skip


def test_a_running_job_ends_at_its_eta_and_one_without_never() -> None:
    assert job_end({"phase": "Running", "progress": {"etaSeconds": 120}}, NOW) == NOW + 120
    assert job_end({"phase": "Running", "progress": {}}, NOW) == math.inf
    assert job_end({"phase": "Restarting", "progress": {"etaSeconds": 5}}, NOW) == math.inf


def on(node: str, job: str | None, bound: bool = True, agent: bool = False, **requests: int) -> PodOnNode:
    return PodOnNode(node, job, bound, requests or {"nvidia.com/gpu": 4000}, 0, agent=agent)


def test_a_node_is_free_when_its_last_job_ends_and_never_with_work_of_unknown_end() -> None:
    ends = {"ns/a": NOW + 50, "ns/b": NOW + 80}
    pods = [on("n0", "ns/a"), on("n0", "ns/b"), on("n1", "ns/a"), on("n2", None), on("n3", "ns/c")]
    assert node_free_at(pods, ends, NOW) == {"n0": NOW + 80, "n1": NOW + 50, "n2": math.inf, "n3": math.inf}


def test_a_job_well_past_its_end_has_no_known_end() -> None:
    # An estimate is one: 2 s past it the job still ends; further past, it overran and may run on.
    assert node_free_at([on("n0", "ns/a")], {"ns/a": NOW - 1.5}, NOW) == {"n0": NOW - 1.5}
    assert node_free_at([on("n0", "ns/a")], {"ns/a": NOW - 60}, NOW) == {"n0": math.inf}


def test_a_pod_admitted_and_not_bound_yet_has_no_known_end() -> None:
    # Its run begins when it binds: the end its job reports is an earlier run's, or none; a create in
    # flight (no job known, not bound) likewise, whatever it asks for.
    ends = {"ns/a": NOW + 50, "ns/b": NOW + 9}
    assert node_free_at([on("n0", "ns/a"), on("n0", "ns/b", bound=False)], ends, NOW) == {"n0": math.inf}
    assert node_free_at([on("n1", None, bound=False, cpu=1000)], {}, NOW) == {"n1": math.inf}


def test_a_node_agent_without_accelerators_does_not_keep_a_node_from_freeing() -> None:
    # Every node of a real cluster runs DaemonSet pods (device plugin, exporters, CNI): counted as
    # work of unknown end they would keep every node from ever being lent or traded.
    agent = on("n0", None, agent=True, cpu=100, memory=200 * 2**20, pods=1000)
    assert node_free_at([on("n0", "ns/a"), agent], {"ns/a": NOW + 50}, NOW) == {"n0": NOW + 50}
    assert node_free_at([agent], {}, NOW) == {}, "a node with agents only is free now"
    pending = on("n0", None, bound=False, agent=True, cpu=100)  # a DaemonSet's pod is pinned to its node
    assert node_free_at([on("n0", "ns/a"), pending], {"ns/a": NOW + 50}, NOW) == {"n0": NOW + 50}
    assert node_free_at([on("n1", None, agent=True)], {}, NOW) == {"n1": math.inf}, "an agent holding a GPU"
    hugepages = on("n3", None, agent=True, **{"hugepages-2Mi": 512 * 2**20 * 1000, "cpu": 100})
    assert node_free_at([hugepages], {}, NOW) == {}, "hugepages are native, not an accelerator"
    # Another owner's cpu-only pod that is no agent (a Deployment's, a notebook) may hold what the
    # head needs for as long as it likes.
    assert node_free_at([on("n2", None, cpu=30000)], {}, NOW) == {"n2": math.inf}


def test_the_estimate_is_the_spec_hint_else_the_steps_left_at_the_measured_pace() -> None:
    assert estimate_seconds(spec(expectedRunSeconds=600), {}) == 600
    ran_before = {
        "progress": {"totalSteps": 1000},
        "lastCheckpoint": {"step": 400},
        "goodput": {"stepMilliseconds": 250},
    }
    assert estimate_seconds(spec(), ran_before) == pytest.approx(150.0)
    assert estimate_seconds(spec(), {}) is None


def blocked_head_and_a_short_job(estimate: float | None) -> list[str]:
    """node-0 and node-1 each run a job with 4 of 8 GPUs, ending at +100 s; the head needs both
    nodes whole. A 1-pod, 4-GPU gang behind it asks for the free half of a reserved node."""
    nodes = [gpu_node("node-0"), gpu_node("node-1")]
    used = {"node-0": {"nvidia.com/gpu": 4000}, "node-1": {"nvidia.com/gpu": 4000}}
    head = gang("head", 2, 8, created=0.0)
    short = gang("short", 1, 4, created=1.0, estimate_seconds=estimate)
    plan = plan_admission([head, short], nodes, used, NOW, free_at={"node-0": NOW + 100, "node-1": NOW + 100})
    assert "head" in plan.reservations and "head" in plan.waiting
    return [a.key for a in plan.admitted]


def test_a_gang_ending_before_the_head_can_start_uses_the_heads_idle_room() -> None:
    assert blocked_head_and_a_short_job(60.0) == ["short"]


def test_a_gang_that_would_end_after_the_head_could_start_waits_as_today() -> None:
    assert blocked_head_and_a_short_job(150.0) == []
    assert blocked_head_and_a_short_job(None) == []


def test_without_node_end_times_nothing_is_lent() -> None:
    nodes = [gpu_node("node-0"), gpu_node("node-1")]
    used = {"node-0": {"nvidia.com/gpu": 4000}, "node-1": {"nvidia.com/gpu": 4000}}
    plan = plan_admission(
        [gang("head", 2, 8), gang("short", 1, 4, created=1.0, estimate_seconds=1.0)], nodes, used, NOW
    )
    assert not plan.admitted


def test_a_head_whose_start_is_unknown_lends_nothing() -> None:
    # node-0's work has no ETA: the head may start any minute, so even a short gang must wait.
    nodes = [gpu_node("node-0"), gpu_node("node-1")]
    used = {"node-0": {"nvidia.com/gpu": 4000}, "node-1": {"nvidia.com/gpu": 4000}}
    head, short = gang("head", 2, 8), gang("short", 1, 4, created=1.0, estimate_seconds=1.0)
    plan = plan_admission([head, short], nodes, used, NOW, free_at={"node-0": math.inf, "node-1": NOW + 100})
    assert not plan.admitted


def test_an_eta_read_a_while_ago_counts_from_when_it_was_read() -> None:
    # From the review (issue 17): at >= 600 jobs the newest report may be 30 s old; its ETA runs
    # from the poll that read it, not from the admission pass.
    running = {"phase": "Running", "progress": {"etaSeconds": 120}}
    assert job_end(running, NOW, read_at=NOW - 30) == NOW - 30 + 120
    assert job_end(running, NOW, read_at=NOW + 5) == NOW + 120  # a clock ahead: never later than read now


def test_a_first_attempt_that_states_its_run_time_ends_that_long_after_its_start() -> None:
    job = {"spec": {"scheduling": {"expectedRunSeconds": 20}}, "status": {"phase": "Running"}}
    assert stated_end(job, NOW) == NOW + 20
    assert stated_end(job, None) is None, "not started"
    assert stated_end({**job, "status": {"phase": "Running", "attempt": 1}}, NOW) is None, (
        "startTime is the first's"
    )
    assert stated_end({**job, "status": {"phase": "Running", "restarts": {"failures": 1}}}, NOW) is None
    assert stated_end({**job, "status": {"phase": "Succeeded"}}, NOW) is None
    assert stated_end({"spec": {}, "status": {"phase": "Running"}}, NOW) is None


# -- the head's nodes: busy ones that free by its start rather than idle ones -------------------------
def four_nodes() -> tuple[list[NodeInfo], dict[str, dict[str, int]]]:
    """n0-n2 run work on all 8 GPUs (each test says when it ends); n3 is idle."""
    nodes = [gpu_node(f"n{i}") for i in range(4)]
    return nodes, {name: {"nvidia.com/gpu": 8000} for name in ("n0", "n1", "n2")}


def test_a_blocked_head_holds_busy_nodes_that_free_by_its_start_and_leaves_the_idle_one_to_others() -> None:
    ends = {"n0": NOW + 20, "n1": NOW + 20, "n2": NOW + 20}
    nodes, used = four_nodes()
    head, small = gang("head", 3, 8), gang("small", 1, 8, created=1.0)  # small states no run time
    plan = plan_admission([head, small], nodes, used, NOW, free_at=ends)
    assert plan.reservations == {"head": ("n0", "n1", "n2")}, "it starts at +20 all the same"
    assert [(a.key, a.placements) for a in plan.admitted] == [("small", (("small-0", "n3"),))]
    # Without the ends it holds the idle node, which idles until the head can start.
    plan = plan_admission([head, small], nodes, used, NOW)
    assert "n3" in plan.reservations["head"] and not plan.admitted


def test_a_node_whose_work_ends_after_the_head_could_start_is_never_taken_for_an_idle_one() -> None:
    for late in (NOW + 30, math.inf):  # ends later; end unknown
        ends = {"n0": NOW + 20, "n1": NOW + 20, "n2": late}
        nodes, used = four_nodes()
        plan = plan_admission(
            [gang("head", 3, 8), gang("small", 1, 8, created=1.0)], nodes, used, NOW, free_at=ends
        )
        assert plan.reservations == {"head": ("n0", "n1", "n3")} and not plan.admitted, late


def test_neither_a_node_this_pass_filled_nor_an_overbooked_one_is_taken_for_an_idle_one() -> None:
    # n2 is idle too: "first" takes it in this pass and runs on with no end known; a head counting it
    # as freeing by its start (it has no free_at) would lend the idle n3 away and wait for ever.
    ends = {"n0": NOW + 20, "n1": NOW + 20}
    nodes, used = four_nodes()
    del used["n2"]
    plan = plan_admission(
        [gang("first", 1, 8), gang("head", 3, 8, created=1.0), gang("small", 1, 8, created=2.0)],
        nodes, used, NOW, free_at=ends,
    )  # fmt: skip
    taken = dict(plan.admitted[0].placements)["first-0"]
    assert [a.key for a in plan.admitted] == ["first"]
    assert taken not in plan.reservations["head"] and len(plan.reservations["head"]) == 3
    # Overbooked: a gang started early waits on n2 for the room, then stays its whole run.
    ends = {"n0": NOW + 20, "n1": NOW + 20, "n2": NOW + 20}
    nodes, used = four_nodes()
    used["n2"] = {"nvidia.com/gpu": 16000}
    plan = plan_admission(
        [gang("head", 3, 8), gang("small", 1, 8, created=1.0)], nodes, used, NOW, free_at=ends
    )
    assert plan.reservations == {"head": ("n0", "n1", "n3")} and not plan.admitted


def test_a_head_whose_kept_node_overran_keeps_its_nodes_and_trades_nothing() -> None:
    # n2's job is 3 s past its end: no known end now, so no trade counts on it (it would be picked
    # first, as the soonest free); and the head keeps the nodes it held, not a fresh choice.
    job_ends = {"ns/long": NOW + 3600, "ns/over": NOW - 3}
    free_at = node_free_at([on("n0", "ns/long"), on("n1", "ns/long"), on("n2", "ns/over")], job_ends, NOW)
    assert free_at == {"n0": NOW + 3600, "n1": NOW + 3600, "n2": math.inf}
    nodes, used = four_nodes()
    previous = {"head": ("n1", "n2", "n3")}
    gangs = [gang("head", 3, 8), gang("small", 1, 8, created=1.0)]
    plan = plan_admission(gangs, nodes, used, NOW, reservations=previous, free_at=free_at)
    assert plan.reservations == previous and not plan.admitted


def test_a_head_that_may_preempt_keeps_the_idle_node_it_holds() -> None:
    # Above the running work's priority, the head stops victims for the room it lacks: the idle node
    # handed to "small" would cost it one victim more.
    ends = {"n0": NOW + 20, "n1": NOW + 20, "n2": NOW + 20}
    nodes, used = four_nodes()
    head, small = gang("head", 3, 8, priority=10), gang("small", 1, 8, created=1.0, priority=10)
    plan = plan_admission([head, small], nodes, used, NOW, free_at=ends, lowest_running_priority=0)
    assert "n3" in plan.reservations["head"] and not plan.admitted
    plan = plan_admission([head, small], nodes, used, NOW, free_at=ends, lowest_running_priority=10)
    assert plan.reservations == {"head": ("n0", "n1", "n2")}, "nothing below it to preempt: it trades"


def test_the_pass_reads_the_priority_a_head_must_exceed_to_preempt() -> None:
    from phalanx.controller.admission_pass import lowest_running_priority

    def job(phase: str, klass: str | None, **extra: object) -> dict[str, object]:
        spec: dict[str, object] = {"scheduling": {"priorityClassName": klass} if klass else {}}
        labels = extra.pop("labels", {})
        return {"metadata": {"labels": labels}, "spec": {**spec, **extra}, "status": {"phase": phase}}

    priorities = {"high": 100, "low": -5}
    assert lowest_running_priority([job("Running", "high"), job("Admitted", None)], priorities) == 0
    assert lowest_running_priority([job("Pending", "low"), job("Succeeded", "low")], priorities) is None
    # Another provider's job is the preemptor's too; Kueue's and another manager's are not.
    assert lowest_running_priority([job("Running", "low", provider={"name": "volcano"})], priorities) == -5
    kueues = job("Running", "low", labels={"kueue.x-k8s.io/queue-name": "q"})
    elsewhere = job("Running", "low", managedBy="kueue.x-k8s.io/multikueue")
    assert lowest_running_priority([kueues, elsewhere], priorities) is None
    # A job with warm spares, restarting too: a head of its priority may take a spare's room.
    assert lowest_running_priority([job("Restarting", "high", spares=1)], priorities) == 99
    assert lowest_running_priority([job("Restarting", "high")], priorities) is None
