"""The resident launcher's decisions (restart in place), one event at a time."""

from __future__ import annotations

import pytest

from phalanx_trainer.restart_policy import (
    Action,
    BadRequest,
    GenerationRequest,
    State,
    StopMode,
    admit,
    combine_exit_codes,
    on_launcher_terminated,
    on_wait_expired,
    on_workers_exited,
    parse_generation_request,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("codes", "terminated", "pending", "action", "code"),
    [
        ([0, 0], False, False, Action.EXIT, 0),  # finished
        ([1, 75], False, True, Action.EXIT, 1),  # a permanent error wins even over a new generation
        ([2], False, False, Action.EXIT, 2),
        ([75, 75], False, False, Action.WAIT, 75),  # agreed stop without the launcher's own SIGTERM
        ([76], False, False, Action.WAIT, 76),  # lost peer
        ([137], False, False, Action.WAIT, 137),  # a worker killed: the pod is still fine
        ([75, 76], False, False, Action.WAIT, 76),
        ([75], False, True, Action.START, 75),  # stopped for the accepted generation
        ([76], False, True, Action.START, 76),
        ([75], True, False, Action.EXIT, 75),  # its own SIGTERM: as today
        ([75], True, True, Action.EXIT, 75),  # the pod goes away: no new generation here
        ([137], True, False, Action.EXIT, 137),
    ],
)
def test_what_the_launcher_does_when_its_workers_exit(
    codes: list[int], terminated: bool, pending: bool, action: Action, code: int
) -> None:
    decision = on_workers_exited(codes, launcher_terminated=terminated, pending=pending)
    assert (decision.action, decision.exit_code) == (action, code)


def test_combined_code_prefers_the_first_code_that_is_not_75() -> None:
    assert combine_exit_codes([0, 0]) == 0
    assert combine_exit_codes([75, 0, 75]) == 75
    assert combine_exit_codes([75, 137, 76]) == 137


def test_an_expired_wait_exits_with_the_workers_code_so_the_full_restart_takes_over() -> None:
    assert on_wait_expired(76).exit_code == 76 and on_wait_expired(76).action is Action.EXIT
    assert on_wait_expired(None).exit_code == 75  # a spare never assigned: nothing lost


@pytest.mark.parametrize("state", [State.WAITING, State.SPARE])
def test_sigterm_while_idle_exits_at_once(state: State) -> None:
    decision = on_launcher_terminated(state, 75 if state is State.WAITING else None)
    assert decision is not None and (decision.action, decision.exit_code) == (Action.EXIT, 75)


@pytest.mark.parametrize("state", [State.RUNNING, State.STOPPING])
def test_sigterm_with_workers_up_waits_for_their_exit(state: State) -> None:
    assert on_launcher_terminated(state, None) is None


def request(generation: int) -> GenerationRequest:
    return GenerationRequest(generation, {}, StopMode.CHECKPOINT)


@pytest.mark.parametrize("state", [State.RUNNING, State.WAITING, State.SPARE, State.STOPPING])
def test_only_a_newer_generation_is_admitted(state: State) -> None:
    assert admit(request(3), 2, state).accepted
    equal, older = admit(request(2), 2, state), admit(request(1), 2, state)
    assert not equal.accepted and "not newer than the current 2" in equal.reason
    assert not older.accepted


def test_nothing_is_admitted_once_done() -> None:
    assert not admit(request(9), 0, State.DONE).accepted


def test_a_request_parses_with_defaults() -> None:
    parsed = parse_generation_request({"generation": 4, "env": {"MASTER_PORT": 29501}}, spare=False)
    assert parsed == GenerationRequest(4, {"MASTER_PORT": "29501"}, StopMode.CHECKPOINT)
    assert parse_generation_request({"generation": 1, "stop": "now"}, spare=False).stop is StopMode.NOW


@pytest.mark.parametrize(
    ("body", "spare", "message"),
    [
        ([], False, "body: expected a JSON object"),
        ({}, False, "generation: expected a non-negative integer"),
        ({"generation": "1"}, False, "generation: expected a non-negative integer"),
        ({"generation": True}, False, "generation: expected a non-negative integer"),
        ({"generation": 1, "env": {"RANK": "3"}}, False, "env: RANK cannot change per generation"),
        ({"generation": 1, "env": ["NODE_RANK"]}, False, "env: expected an object of strings"),
        ({"generation": 1, "stop": "later"}, False, 'stop: expected "checkpoint" or "now"'),
        ({"generation": 1}, True, "env.NODE_RANK: a spare's first generation must say which rank"),
    ],
)
def test_bad_requests_name_the_field(body: object, spare: bool, message: str) -> None:
    with pytest.raises(BadRequest, match=message.replace("(", r"\(")):
        parse_generation_request(body, spare=spare)


def test_a_gloo_transport_error_counts_as_a_lost_peer_and_a_code_bug_does_not() -> None:
    import torch.distributed as dist

    from phalanx_trainer.generation import lost_peer

    gloo = "[.../gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:10472: Connection reset by peer."
    assert lost_peer(RuntimeError(gloo))
    assert lost_peer(dist.DistBackendError("NCCL watchdog timeout"))
    assert not lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x32 and 16x8)"))
    assert not lost_peer(ValueError("Connection reset by peer"))  # only what torch raises
