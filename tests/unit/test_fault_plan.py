"""The fault proxy's storm (tests/faults.py), pure: what the reliability tests rely on to be
deterministic in tries rather than in time."""

from __future__ import annotations

import pytest

from tests.faults import FaultPlan, Storm

pytestmark = pytest.mark.unit

PODS = "/api/v1/namespaces/ns/pods"


def served(plan: FaultPlan, requests: list[tuple[str, str]]) -> list[int | None]:
    answers = []
    for method, path in requests:
        fault = plan.fault_for(method, path, is_watch=False)
        answers.append(None if fault is None else fault.status)
    return answers


def test_no_endpoint_is_refused_more_than_most_in_a_row_times_running() -> None:
    plan = FaultPlan()
    plan.open(Storm(probability=1.0, faults=1000, most_in_a_row=2))
    answers = served(plan, [("GET", "/apis/x")] * 9)
    assert answers == [429, 503, None] * 3


def test_the_window_closes_itself_after_its_faults_are_served() -> None:
    plan = FaultPlan()
    plan.open(Storm(probability=1.0, faults=3, most_in_a_row=5))
    assert served(plan, [("GET", "/a")] * 5) == [429, 503, 429, None, None]
    assert plan.injected == 3


def test_the_first_request_to_a_chosen_path_is_always_refused_and_loses_its_answer() -> None:
    plan = FaultPlan()
    plan.open(Storm(probability=0.0, first_refused=(("POST", PODS),), lost_answers=True))
    assert plan.fault_for("GET", PODS, is_watch=False) is None  # a read does not use it up
    first = plan.fault_for("POST", PODS + "?fieldManager=phalanx", is_watch=False)
    assert first is not None and first.after_upstream
    assert plan.fault_for("POST", PODS, is_watch=False) is None  # only the first


def test_the_same_seed_draws_the_same_storm_for_the_same_order_of_requests() -> None:
    requests = [("GET", f"/r{i % 3}") for i in range(60)]
    draws = []
    for _ in range(2):
        plan = FaultPlan()
        plan.open(Storm(probability=0.5, seed=7, faults=100))
        draws.append(served(plan, requests))
    assert draws[0] == draws[1] and 0 < sum(a is not None for a in draws[0]) < 60


def test_watches_pass_when_the_storm_leaves_them_out_and_nothing_fails_once_closed() -> None:
    plan = FaultPlan()
    plan.open(Storm(probability=1.0, include_watches=False))
    assert plan.fault_for("GET", "/api/v1/pods?watch=true", is_watch=True) is None
    plan.close()
    assert plan.fault_for("GET", "/api/v1/pods", is_watch=False) is None
