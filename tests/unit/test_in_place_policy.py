"""Restart in place, the policy (policy/in_place.py): which pods are kept, which replaced, and why
not, in the order the reasons are checked; and the one answer to which pods are the current
attempt's (pod_facts.in_current_attempt)."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.pod_facts import in_current_attempt, kept_pod_uids
from phalanx.policy.in_place import (
    Fallback,
    InPlaceRestart,
    KeptPod,
    in_place_attempt_unfinished,
    kept_pods_status,
    plan_in_place,
    runs_resident_launcher,
)
from phalanx.policy.pod_outcome import OutcomeKind, PodOutcome
from phalanx.policy.recovery_timeline import recovery_path

pytestmark = pytest.mark.unit

RUNNING_STATUS = {"attempt": 0, "phase": "Running"}


def launcher_pod(index: int, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"j-worker-{index}", "uid": f"u{index}",
                     "labels": {"phalanx.dev/attempt": "0", "phalanx.dev/replica-index": str(index)},
                     "annotations": {"phalanx.dev/resident-launcher": "true"}},
        "status": {"phase": "Running", "podIP": f"10.0.0.{index}", **status},
    }  # fmt: skip


def outcome(index: int, kind: OutcomeKind, reason: str = "r") -> PodOutcome:
    return PodOutcome(f"j-worker-{index}", kind, reason, "m")


RUN, PRE, RETRY = OutcomeKind.RUNNING, OutcomeKind.PREEMPTED, OutcomeKind.FAILED_RETRYABLE


def test_the_running_pods_are_kept_and_every_lost_index_replaced() -> None:
    pods = {i: launcher_pod(i) for i in range(4)}
    outcomes = [outcome(0, RUN), outcome(1, PRE), outcome(2, RUN), outcome(3, RETRY)]
    assert plan_in_place("InPlace", RUNNING_STATUS, outcomes, pods) == InPlaceRestart(
        (KeptPod(0, "j-worker-0", "u0"), KeptPod(2, "j-worker-2", "u2")), (1, 3)
    )


def test_a_kept_pod_whose_labels_do_not_say_its_rank_carries_it_forward() -> None:
    # A spare that took rank 1 and was never relabelled: the next in-place attempt keeps its rank,
    # or replica_index reads -1 and the spare is counted idle again (two pods for one rank).
    spare = launcher_pod(1)
    spare["metadata"].update(
        name="j-spare-0", uid="s0", labels={"phalanx.dev/attempt": "0", "phalanx.dev/spare": "true"}
    )
    pods = {0: launcher_pod(0), 1: spare, 2: launcher_pod(2)}
    decision = plan_in_place(
        "InPlace", RUNNING_STATUS, [outcome(0, RUN), outcome(1, RUN), outcome(2, PRE)], pods
    )
    assert isinstance(decision, InPlaceRestart)
    assert kept_pods_status(decision) == [
        {"name": "j-worker-0", "uid": "u0"},
        {"name": "j-spare-0", "uid": "s0", "rank": 1},
    ]


def test_full_restart_is_not_in_place_at_all() -> None:
    assert plan_in_place("FullRestart", RUNNING_STATUS, [outcome(0, RUN), outcome(1, PRE)], {}) is None


def test_the_reasons_are_checked_in_order_two_failures_in_one_generation_first() -> None:
    # Everything is wrong at once: the first reason in the module's list is the one given.
    status = {"attempt": 2, "phase": "Restarting", "inPlace": {"attempt": 2}}
    decision = plan_in_place("InPlace", status, [outcome(0, PRE), outcome(1, PRE)], {})
    assert isinstance(decision, Fallback) and "two failures in one generation" in decision.why
    decision = plan_in_place("InPlace", {**status, "inPlace": {"attempt": 1}}, [outcome(0, PRE)], {})
    assert isinstance(decision, Fallback) and "not running whole" in decision.why


def test_a_lost_pod_that_is_neither_preempted_nor_retryable_falls_back() -> None:
    decision = plan_in_place(
        "InPlace", RUNNING_STATUS, [outcome(0, RUN), outcome(1, OutcomeKind.PENDING)], {}
    )
    assert decision == Fallback("j-worker-1 is Pending, not preempted or failed retryably")


def test_a_kept_pod_without_an_address_or_going_away_falls_back() -> None:
    outcomes = [outcome(0, RUN), outcome(1, PRE)]
    decision = plan_in_place("InPlace", RUNNING_STATUS, outcomes, {0: launcher_pod(0, podIP=None)})
    assert isinstance(decision, Fallback) and "no address" in decision.why


def test_unfinished_until_the_in_place_attempts_first_step() -> None:
    status: dict[str, Any] = {"attempt": 1, "inPlace": {"attempt": 1}}
    assert in_place_attempt_unfinished(status)
    status["lastRecovery"] = {"attempt": 1, "phasesMilliseconds": {"podsRunning": 10}}
    assert in_place_attempt_unfinished(status)
    status["lastRecovery"]["phasesMilliseconds"]["firstStep"] = 20
    assert not in_place_attempt_unfinished(status)
    assert not in_place_attempt_unfinished({"attempt": 2, "inPlace": {"attempt": 1}})  # an older one


def test_only_a_pod_built_with_a_resident_launcher_counts() -> None:
    assert runs_resident_launcher(launcher_pod(0))
    plain = launcher_pod(0)
    plain["metadata"]["annotations"] = {"phalanx.dev/resident-launcher": "false"}
    assert not runs_resident_launcher(plain) and not runs_resident_launcher({"metadata": {}})


def test_a_kept_pod_belongs_to_the_current_attempt_by_name_and_uid() -> None:
    status = {"attempt": 1, "inPlace": {"attempt": 1, "keptPods": [{"name": "j-worker-0", "uid": "u0"}]}}
    kept = launcher_pod(0)
    assert kept_pod_uids(status) == {"j-worker-0": "u0"}
    assert in_current_attempt(kept, status)
    assert not in_current_attempt({**kept, "metadata": {**kept["metadata"], "uid": "other"}}, status)
    assert not in_current_attempt(launcher_pod(1), status)  # attempt 0 and not kept: stale
    # Once a later attempt starts, status.inPlace of an earlier one keeps nothing.
    assert not in_current_attempt(kept, {**status, "attempt": 2})
    assert in_current_attempt(kept, {"attempt": 0})  # its own attempt's label


def test_the_recovery_path_follows_status_in_place() -> None:
    assert recovery_path({"attempt": 1, "inPlace": {"attempt": 1}}) == "InPlace"
    assert recovery_path({"attempt": 2, "inPlace": {"attempt": 1}}) == "FullRestart"
    assert recovery_path({"attempt": 1}) == "FullRestart"


def on_node(pod: dict[str, Any], node_name: str) -> dict[str, Any]:
    return {**pod, "spec": {"nodeName": node_name}}


CORDONED = {"n1": {"metadata": {"name": "n1"}, "spec": {"unschedulable": True}}}
FAIL = OutcomeKind.FAILED_RETRYABLE


def three_pods(node_of_0: str = "n0") -> dict[int, dict[str, Any]]:
    return {0: on_node(launcher_pod(0), node_of_0), 1: on_node(launcher_pod(1), "n1"),
            2: on_node(launcher_pod(2), "n1")}  # fmt: skip


def test_a_running_pod_on_a_cordoned_node_a_rank_was_preempted_from_is_replaced_with_it() -> None:
    # A drain evicts worker-1 first; worker-2 on the same cordoned node is next. Before: worker-2
    # was kept, its eviction came before the attempt's first step, and the gang restarted whole.
    outcomes = [outcome(0, RUN), outcome(1, PRE), outcome(2, RUN)]
    decision = plan_in_place("InPlace", RUNNING_STATUS, outcomes, three_pods(), CORDONED)
    assert isinstance(decision, InPlaceRestart)
    assert decision.kept == (KeptPod(0, "j-worker-0", "u0"),) and decision.lost == (1, 2)
    why = "it is cordoned, and j-worker-1 was preempted from it"
    assert decision.emptied == {2: f"node n1 is being emptied: {why}"}
    assert decision.emptying_nodes == {"n1": why}
    # The same gang with n1 schedulable: worker-2 stays.
    decision = plan_in_place("InPlace", RUNNING_STATUS, outcomes, three_pods(), {})
    assert isinstance(decision, InPlaceRestart) and decision.lost == (1,) and decision.emptied == {}


def test_a_failure_on_a_node_that_is_only_cordoned_keeps_its_neighbours() -> None:
    # A cordon alone says "no new pods" (a suspect node left to finish its jobs): an OOM there is
    # no sign of an eviction to come, and replacing worker-2 would only need room elsewhere.
    outcomes = [outcome(0, RUN), outcome(1, FAIL), outcome(2, RUN)]
    decision = plan_in_place("InPlace", RUNNING_STATUS, outcomes, three_pods(), CORDONED)
    assert isinstance(decision, InPlaceRestart) and decision.lost == (1,) and decision.emptied == {}


def test_a_node_tainted_for_removal_loses_its_ranks_even_with_no_lost_pod_on_it() -> None:
    # Karpenter consolidates n1 and n3 at once; worker-1 (n1) is evicted first, worker-3 (n3) next.
    removed = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
    pods = {**three_pods(), 3: on_node(launcher_pod(3), "n3")}
    nodes = {"n3": {"metadata": {"name": "n3"}, "spec": {"taints": [removed]}}}
    outcomes = [outcome(0, RUN), outcome(1, FAIL), outcome(2, RUN), outcome(3, RUN)]
    decision = plan_in_place("InPlace", RUNNING_STATUS, outcomes, pods, nodes)
    assert isinstance(decision, InPlaceRestart) and decision.lost == (1, 3)
    assert decision.emptied == {3: "node n3 is being emptied: Karpenter is removing it"}


def test_rank_0_on_a_node_being_emptied_falls_back() -> None:
    pods = {**three_pods(node_of_0="n1"), 3: on_node(launcher_pod(3), "n0")}
    outcomes = [outcome(0, RUN), outcome(1, PRE), outcome(2, RUN), outcome(3, RUN)]
    decision = plan_in_place("InPlace", RUNNING_STATUS, outcomes, pods, CORDONED)
    assert isinstance(decision, Fallback)
    assert "rank 0" in decision.why and "node n1 is being emptied" in decision.why
