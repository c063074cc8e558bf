"""The resident launcher (restart in place) with fake workers and a fake clock, and how a worker's
failure becomes its exit code."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import selectors
import signal
import socket
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

import phalanx_trainer.__main__
import phalanx_trainer.heap
import phalanx_trainer.resident
import phalanx_trainer.train
from phalanx.ports import free_port
from phalanx_trainer import contract
from phalanx_trainer.__main__ import run_worker
from phalanx_trainer.config import load_config
from phalanx_trainer.distenv import EnvError, read_dist_env
from phalanx_trainer.generation import StaleGeneration
from phalanx_trainer.resident import ControlServer, ResidentLauncher, Worker
from phalanx_trainer.restart_policy import State

pytestmark = pytest.mark.unit


# ---- a worker's failure -> 76 (the generation broke) or 1 (the code did) -----------------------


def _wrapped(err: BaseException) -> tuple[BaseException, traceback.StackSummary]:
    return err, traceback.StackSummary()


LOST_PEER_ERRORS: list[BaseException] = [
    dist.DistError("store: connection lost"),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError("generation 1: 1 of 2 ranks arrived within 30 s"),
    StaleGeneration("rank 1 is of restart generation 1 but the group is at generation 2"),
    # DCP gathers every rank's failure into one BaseException (not an Exception).
    CheckpointException(
        "save failed", {1: _wrapped(RuntimeError("gloo/transport/tcp: Connection reset by peer"))}
    ),
]

CODE_ERRORS: list[BaseException] = [
    KeyError("model"),
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x4)"),
    CheckpointException("save failed", {0: _wrapped(ValueError("bad state_dict key"))}),
]


def _run_worker_whose_trainer_raises(monkeypatch: pytest.MonkeyPatch, err: BaseException) -> int:
    def broken_trainer(*args: object, **kwargs: object) -> None:
        raise err

    monkeypatch.setattr(phalanx_trainer.train, "Trainer", broken_trainer)
    # A worker freezes its process's heap; this test's process is pytest's.
    monkeypatch.setattr(phalanx_trainer.heap, "freeze_imported", lambda: 0)
    dist_env = dataclasses.replace(read_dist_env({}), restart_in_place=True, generation=1)
    return run_worker(load_config(None, [], 1), dist_env, {})


@pytest.mark.parametrize("err", LOST_PEER_ERRORS, ids=lambda e: type(e).__name__)
def test_a_peer_lost_while_the_trainer_is_built_exits_76(
    monkeypatch: pytest.MonkeyPatch, err: BaseException
) -> None:
    assert _run_worker_whose_trainer_raises(monkeypatch, err) == contract.EXIT_GENERATION_FAILED


@pytest.mark.parametrize("err", CODE_ERRORS, ids=lambda e: type(e).__name__)
def test_a_code_error_while_the_trainer_is_built_is_not_a_lost_peer(
    monkeypatch: pytest.MonkeyPatch, err: BaseException
) -> None:
    with pytest.raises(type(err)):
        _run_worker_whose_trainer_raises(monkeypatch, err)


# ---- the launcher's state machine, with fake workers and a fake clock ---------------------------


class FakeWorker(Worker):
    """A worker that records the signals it gets and exits when the test says."""

    def __init__(self, pid: int, env: Mapping[str, str]) -> None:
        super().__init__(pid)
        self.env = dict(env)
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.exit_code

    def signal(self, signum: int) -> None:
        self.signals.append(signum)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


BASE_ENV = {
    contract.ENV_NPROC_PER_NODE: "2",
    contract.ENV_NNODES: "2",
    contract.ENV_NODE_RANK: "0",
    contract.ENV_RESTART_IN_PLACE: "true",
}


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> list[FakeWorker]:
    """Every worker the launcher starts, in order; nothing is really forked."""
    started: list[FakeWorker] = []

    def fake_fork(argv: Sequence[str], env: Mapping[str, str], close_fds: Sequence[int]) -> Worker:
        started.append(FakeWorker(10_000 + len(started), env))
        return started[-1]

    monkeypatch.setattr(phalanx_trainer.resident, "fork_worker", fake_fork)
    return started


def launcher_of(env: Mapping[str, str] | None = None) -> tuple[ResidentLauncher, FakeClock]:
    clock = FakeClock()
    launcher = ResidentLauncher(["--config", "x.toml"], {**BASE_ENV, **(env or {})}, clock=clock)
    launcher.start_workers()
    return launcher, clock


def exit_all(workers: Sequence[FakeWorker], code: int) -> None:
    for worker in workers:
        worker.exit_code = code


def post(launcher: ResidentLauncher, body: Any) -> tuple[int, dict[str, Any]]:
    return launcher.post_generation(body)


def test_a_post_after_the_launchers_own_sigterm_is_refused_409(forks: list[FakeWorker]) -> None:
    launcher, _ = launcher_of()
    launcher.on_sigterm()
    assert launcher.step() is None  # workers still up: it waits for them
    status, answer = post(launcher, {"generation": 1})
    assert status == 409, answer
    assert "terminat" in answer["error"]


def test_each_worker_gets_sigterm_once_however_many_posts_and_signals_come(forks: list[FakeWorker]) -> None:
    launcher, _ = launcher_of()
    assert post(launcher, {"generation": 1})[0] == 202
    assert post(launcher, {"generation": 2})[0] == 202  # supersedes 1 while stopping
    launcher.on_sigterm()
    launcher.step()
    assert [w.signals for w in forks] == [[signal.SIGTERM], [signal.SIGTERM]]


def test_a_superseding_request_keeps_the_env_of_the_one_it_replaces(forks: list[FakeWorker]) -> None:
    launcher, _ = launcher_of()
    assert post(launcher, {"generation": 1, "env": {contract.ENV_NODE_RANK: "1"}})[0] == 202
    assert post(launcher, {"generation": 2, "env": {contract.ENV_MASTER_PORT: "29600"}})[0] == 202
    exit_all(forks, contract.EXIT_CHECKPOINTED_ON_PREEMPTION)
    assert launcher.step() is None
    assert launcher.state is State.RUNNING and launcher.generation == 2
    new = forks[2:]
    assert [w.env[contract.ENV_NODE_RANK] for w in new] == ["1", "1"]
    assert [w.env[contract.ENV_MASTER_PORT] for w in new] == ["29600", "29600"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"generation": 1, "env": {contract.ENV_NODE_RANK: "abc"}}, "env.NODE_RANK"),
        ({"generation": 1, "env": {contract.ENV_NODE_RANK: "2"}}, "env.NODE_RANK"),  # NNODES is 2
        ({"generation": 1, "env": {contract.ENV_NODE_RANK: "-1"}}, "env.NODE_RANK"),
        ({"generation": 1, "env": {contract.ENV_NNODES: "4", contract.ENV_NODE_RANK: "4"}}, "env.NODE_RANK"),
        ({"generation": 1, "env": {contract.ENV_NODE_RANK: True}}, "env.NODE_RANK"),
        ({"generation": 1, "env": {contract.ENV_MASTER_PORT: "70000"}}, "env.MASTER_PORT"),
        ({"generation": 1, "env": {contract.ENV_NNODES: "0"}}, "env.NNODES"),
        ({"generation": 2**63}, "generation"),
        ({"generation": True}, "generation"),
    ],
)
def test_bad_values_get_400_naming_the_field_and_change_nothing(
    forks: list[FakeWorker], body: dict[str, Any], field: str
) -> None:
    launcher, _ = launcher_of()
    status, answer = post(launcher, body)
    assert status == 400, answer
    assert answer["error"].startswith(f"{field}:")
    assert launcher.state is State.RUNNING and launcher.pending is None
    assert [w.signals for w in forks] == [[], []]


def test_a_rank_below_a_larger_nnodes_in_the_same_request_is_taken(forks: list[FakeWorker]) -> None:
    launcher, _ = launcher_of()
    status, _ = post(
        launcher, {"generation": 1, "env": {contract.ENV_NNODES: "4", contract.ENV_NODE_RANK: "3"}}
    )
    assert status == 202


def test_a_failed_start_stops_the_workers_it_already_started(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[FakeWorker] = []

    def fork_once_then_fail(argv: Sequence[str], env: Mapping[str, str], close_fds: Sequence[int]) -> Worker:
        if started:
            raise BlockingIOError(11, "Resource temporarily unavailable")  # fork's EAGAIN
        started.append(FakeWorker(10_000, env))
        return started[-1]

    monkeypatch.setattr(phalanx_trainer.resident, "fork_worker", fork_once_then_fail)
    monkeypatch.setattr(phalanx_trainer.resident, "STOP_NOW_GRACE_SECONDS", 0.0)
    launcher = ResidentLauncher(["--config", "x.toml"], BASE_ENV, clock=FakeClock())
    with pytest.raises(BlockingIOError):
        launcher.start_workers()
    assert started[0].signals == [signal.SIGTERM, signal.SIGKILL]


# ---- the control server: a slow or oversized client must not stall the launcher's loop ---------


@pytest.fixture
def control(forks: list[FakeWorker]) -> Iterator[tuple[ControlServer, int]]:
    launcher, _ = launcher_of()
    port = free_port()
    server = ControlServer(port, launcher)
    try:
        yield server, port
    finally:
        server.server_close()


def _serve_one(server: ControlServer) -> float:
    """Wait for a connection like the launcher's loop does, handle it, return the seconds it took."""
    with selectors.DefaultSelector() as selector:
        selector.register(server, selectors.EVENT_READ)
        assert selector.select(5.0), "the client never connected"
    started = time.monotonic()
    server.handle_request()
    return time.monotonic() - started


def test_a_client_trickling_its_request_is_cut_off_at_the_request_deadline(
    control: tuple[ControlServer, int],
) -> None:
    server, port = control
    stop = threading.Event()

    def trickle() -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /generation HTTP/1.1\r\n")
            deadline = time.monotonic() + 8.0
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    sock.sendall(b"X")  # one byte at a time: no single read ever times out
                except OSError:
                    return  # the server gave up on us: what this test wants
                time.sleep(0.3)

    client = threading.Thread(target=trickle, daemon=True)
    client.start()
    try:
        # The request deadline is 1 s; the client would go on for 8.
        assert _serve_one(server) < 2.5
    finally:
        stop.set()
        client.join(10)


@pytest.mark.parametrize(
    ("length", "status"), [("1000000", 413), ("65537", 413), ("-1", 400), ("0", 400), ("x", 400)]
)
def test_a_post_content_length_out_of_bounds_is_refused_before_reading(
    control: tuple[ControlServer, int], length: str, status: int
) -> None:
    server, port = control
    answers: list[tuple[int, dict[str, Any]]] = []

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.putrequest("POST", "/generation")
        connection.putheader("Content-Length", length)
        connection.endheaders(b'{"generation": 1}')
        response = connection.getresponse()
        answers.append((response.status, json.loads(response.read())))
        connection.close()

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    assert _serve_one(server) < 1.0
    thread.join(10)
    assert answers and answers[0][0] == status, answers
    assert "Content-Length" in answers[0][1]["error"]
    assert server.launcher.pending is None


# ---- stopping has a deadline --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "deadline"),
    [
        ({"PHALANX_LAUNCHER_STOP_DEADLINE_SECONDS": "40"}, 40.0),
        ({}, 20.0 + 30.0),  # the default emergency budget plus the margin
    ],
)
def test_workers_that_do_not_stop_for_a_checkpoint_are_killed_at_the_stop_deadline(
    forks: list[FakeWorker], env: dict[str, str], deadline: float
) -> None:
    launcher, clock = launcher_of(env)
    assert post(launcher, {"generation": 1})[0] == 202
    clock.now += deadline - 1
    launcher.step()
    assert [w.signals for w in forks] == [[signal.SIGTERM]] * 2
    clock.now += 2
    launcher.step()
    assert [w.signals for w in forks] == [[signal.SIGTERM, signal.SIGKILL]] * 2
    exit_all(forks, 137)
    assert launcher.step() is None
    assert launcher.generation == 1 and launcher.state is State.RUNNING  # the new generation started


def test_a_bad_stop_deadline_names_the_variable() -> None:
    with pytest.raises(EnvError, match="PHALANX_LAUNCHER_STOP_DEADLINE_SECONDS"):
        ResidentLauncher([], {**BASE_ENV, "PHALANX_LAUNCHER_STOP_DEADLINE_SECONDS": "soon"})


# ---- the fork itself -----------------------------------------------------------------------------


def test_sigterm_is_blocked_across_the_fork_and_unblocked_after_it_in_the_parent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocked_at_fork: list[set[int]] = []

    def fake_fork() -> int:
        blocked_at_fork.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        return 4242  # the parent's side

    monkeypatch.setattr(os, "fork", fake_fork)
    worker = phalanx_trainer.resident.fork_worker([], {}, ())
    assert worker.pid == 4242
    assert {signal.SIGTERM, signal.SIGINT} <= blocked_at_fork[0]
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_the_forked_child_unblocks_sigterm_with_the_default_action(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    report = tmp_path / "child.json"

    def child_main(argv: list[str]) -> int:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        handler = signal.getsignal(signal.SIGTERM)
        report.write_text(json.dumps({"blocked": sorted(blocked), "default": handler == signal.SIG_DFL}))
        return 0

    monkeypatch.setattr(phalanx_trainer.__main__, "main", child_main)
    worker = phalanx_trainer.resident.fork_worker([], {}, ())
    _, status = os.waitpid(worker.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    seen = json.loads(report.read_text())
    assert signal.SIGTERM not in seen["blocked"] and signal.SIGINT not in seen["blocked"]
    assert seen["default"]


def test_a_fork_after_cuda_was_initialised_in_the_launcher_fails_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    forked: list[int] = []
    monkeypatch.setattr(os, "fork", lambda: forked.append(1) or 4242)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA was initialised in the resident launcher"):
        phalanx_trainer.resident.fork_worker([], {}, ())
    assert forked == []


# ---- the control server takes a generation only from who holds the pod's token ------------------

TOKEN = "s3cret-token-of-this-pod"


def _post_with(port: int, headers: Mapping[str, str]) -> tuple[int, dict[str, Any], str | None]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("POST", "/generation", body=b'{"generation": 1}', headers=dict(headers))
    response = connection.getresponse()
    answer = (response.status, json.loads(response.read()), response.getheader("WWW-Authenticate"))
    connection.close()
    return answer


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": TOKEN}, 401),  # no scheme
        ({"Authorization": f"Basic {TOKEN}"}, 401),
        ({"Authorization": f"Bearer {TOKEN}"}, 202),
    ],
)
def test_a_generation_is_taken_only_with_the_pods_control_token(
    forks: list[FakeWorker], headers: dict[str, str], status: int
) -> None:
    launcher, _ = launcher_of({"PHALANX_CONTROL_TOKEN": TOKEN})
    port = free_port()
    server = ControlServer(port, launcher)
    answers: list[tuple[int, dict[str, Any], str | None]] = []
    try:
        thread = threading.Thread(target=lambda: answers.append(_post_with(port, headers)), daemon=True)
        thread.start()
        _serve_one(server)
        thread.join(10)
    finally:
        server.server_close()
    assert answers and answers[0][0] == status, answers
    if status == 401:
        assert answers[0][2] == "Bearer"
        assert "PHALANX_CONTROL_TOKEN" in answers[0][1]["error"]
        assert TOKEN not in json.dumps(answers[0][1])  # the answer never echoes the token
        assert launcher.pending is None and launcher.generation == 0
    else:
        assert launcher.pending is not None and launcher.pending.generation == 1


def test_workers_never_see_the_control_token(forks: list[FakeWorker]) -> None:
    launcher_of({"PHALANX_CONTROL_TOKEN": TOKEN})  # starts generation 0's workers
    assert forks and all("PHALANX_CONTROL_TOKEN" not in worker.env for worker in forks)
